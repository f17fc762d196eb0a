"""`batchrl.environments.memory_tasks.CueRecall`: the cue only at the first step, the recall
flag only at the last, +1 / -1 for the last action alone, and the episode's end there."""

import numpy as np
import pytest

from batchrl.environments.memory_tasks import CueRecall


@pytest.mark.parametrize("cues, length", [(2, 4), (3, 7)])
def test_only_the_first_step_shows_the_cue_and_only_the_last_action_is_rewarded(cues, length):
    env = CueRecall(cues, length)
    seen = set()
    for seed in range(12):
        observation, _ = env.reset(seed=seed)
        cue = int(np.argmax(observation[:cues]))
        seen.add(cue)
        np.testing.assert_array_equal(observation, np.eye(cues + 1)[cue])
        for step in range(1, length):
            observation, reward, terminated, truncated, _ = env.step(cue)
            assert (reward, terminated, truncated) == (0.0, False, False)
            flag = np.zeros(cues + 1)
            flag[-1] = step == length - 1
            np.testing.assert_array_equal(observation, flag)
        answer = cue if seed % 2 else (cue + 1) % cues
        _, reward, terminated, _, _ = env.step(answer)
        assert terminated and reward == (1.0 if answer == cue else -1.0)
        with pytest.raises(RuntimeError, match="after the episode's end"):
            env.step(0)
    assert seen == set(range(cues))  # Every cue comes up.


def test_too_few_cues_or_steps_are_refused():
    with pytest.raises(ValueError, match="cues >= 2 and length >= 2"):
        CueRecall(1, 8)
