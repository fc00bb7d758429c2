"""The names a benchmark gives its numbers, declared in the benchmark's own module.

Kept apart from `results` (which needs numpy for the statistics) because every benchmark
module imports it when the registry loads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ViewLabel:
    """How a benchmark names one of its per-question views (declared in its module)."""

    name: str  # the key in `Score.views`: "binned", "official", "acc@0.5", ...
    title: str  # the line above the view's table in the terminal
    label: str  # the row label of the view in the reports' aggregate views


@dataclass(frozen=True)
class Labels:
    """The names a benchmark's paper gives its headline numbers. `{types}` in `average`
    is replaced by the number of question types."""

    overall: str = "overall accuracy (question-weighted)"
    average: str = "average accuracy (unweighted mean of the per-type accuracies)"
    views: tuple[ViewLabel, ...] = ()

    def view(self, name: str) -> ViewLabel:
        for v in self.views:
            if v.name == name:
                return v
        return ViewLabel(name, name, name)
