"""Shared by the one-off experiments here: Sessions whose plan is edited after planning, and per-dispatch medians.

  from planedit import edited_plans, dispatch_medians
  with edited_plans(lambda dispatches: dispatches + dispatches):   # every Session made inside sees the edit
      medians, names = dispatch_medians(model, x)"""
import contextlib
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "models"))

from minirt import Session  # noqa: E402

_plan_for = Session.plan_for


@contextlib.contextmanager
def edited_plans(edit):
    """Sessions created inside run edit(list of Dispatch) -> list of Dispatch on each plan they make (None: as is)."""
    def plan_for(self, shapes):
        plan = _plan_for(self, shapes)
        if edit is not None:
            plan.dispatches = list(edit(list(plan.dispatches)))
        return plan
    Session.plan_for = plan_for
    try:
        yield
    finally:
        Session.plan_for = _plan_for


def dispatch_medians(model, x, runs=40, warm=5, **session_args):
    """(median GPU us of each dispatch over `runs` runs after `warm` untimed ones, [(kernel, node)]), a stamp after
    every dispatch."""
    with Session(model, profile=True, **session_args) as s:
        per = None
        for i in range(runs + warm):
            s.run(x)
            recs = s.profile_records()
            if i >= warm:
                per = per or [[] for _ in recs]
                for t, r in zip(per, recs):
                    t.append(r.gpu_ms * 1e3)
        names = [(r.kernel, r.node) for r in recs]
    return [statistics.median(t) for t in per], names


def span_median(model, x, runs=40, warm=5, **session_args):
    """Median GPU span (us) of `runs` runs, two stamps a run (profile="span")."""
    with Session(model, profile="span", **session_args) as s:
        t = []
        for i in range(runs + warm):
            s.run(x)
            if i >= warm:
                t.append(s.gpu_span_ms() * 1e3)
    return statistics.median(t)
