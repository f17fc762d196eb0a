"""Actors and a learner in separate processes: the actors act with copies of the policy and
record fragments of experience (`fragment`), the learner learns from them."""
