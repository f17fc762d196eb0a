"""What a training phase did and the lines that show it: `PhaseResult`, the progress bar's
postfix and the line printed after each train phase (and its eval)."""

import dataclasses

import numpy as np


@dataclasses.dataclass
class PhaseResult:
    """What one phase did: `steps` environment steps, `seconds` of wall-clock time, and the
    undiscounted returns (`scores`) and lengths of the episodes that ended in it
    (`mean_score` is NaN when none did); `no_episode`, what the report line says when none
    did (None: `report_line`'s reason for a phase that steps its own batch)."""

    name: str
    global_step: int
    steps: int
    seconds: float
    scores: list
    lengths: list
    no_episode: str | None = None

    @property
    def mean_score(self):
        return float(np.mean(self.scores)) if self.scores else float("nan")

    @property
    def steps_per_second(self):
        return self.steps / max(self.seconds, 1e-9)


def bar_postfix(phases):
    """The progress bar's postfix (str): each of `phases` (`PhaseResult`s) with its mean
    score, or "no episode"."""
    return "  ".join(f"{p.name} {p.mean_score:.1f}" if p.scores else
                     f"{p.name} no episode" for p in phases)


def report_line(phases, agents):
    """The line printed after a train phase (and its eval): each phase's mean score,
    episodes and speed. A phase in which no episode ended (a train phase of fewer steps
    per agent than an episode has: it begins new episodes, and the next eval phase
    cuts them) says so, and why, where its mean would be NaN. `agents`: the batch size."""
    parts = [f"step {phases[0].global_step:>10,}"]
    for phase in phases:
        speed = f"{phase.steps_per_second:,.0f} steps/s"
        if phase.scores:
            parts.append(f"{phase.name} score {phase.mean_score:9.1f} "
                         f"({len(phase.scores)} episodes, {speed})")
        elif phase.no_episode:
            parts.append(f"{phase.name}: no episode ended in this phase ({phase.no_episode}; "
                         f"{speed})")
        else:
            parts.append(
                f"{phase.name}: no episode ended in this phase (phases of "
                f"{phase.steps // agents:,} steps per agent, shorter than an episode; "
                f"{speed})")
    return "  ".join(parts)
