"""Test helper: PyTorch's own pipeline orders (torch.distributed.pipelining, in .venv).

  pytorch_schedules.py OUT_DIR NAME:PP:V:M [NAME:PP:V:M ...]

For each schedule, PyTorch's schedule class is built over stand-in stage objects (only the
attributes its constructor reads: stage index, number of stages, group rank and size), and
its pipeline_order (the compute actions per rank, idle slots dropped) is written to
OUT_DIR/NAME-PP-V-M.txt as "rank R: 0F0 0F1 ...", the format of hyperpar-schedule
--compute_only; sizes PyTorch's constructor rejects give one line "refused: <its message>". The stages of rank 0 are the ones given, as PyTorch needs them; the order
of every rank is computed by PyTorch from its own formulas.
"""
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S


class StandInStage:
    def __init__(self, index, n_stages, rank, size):
        self.stage_index, self.num_stages = index, n_stages
        self.group_rank, self.group_size = rank, size
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.has_backward = True
        self.submod = torch.nn.Linear(1, 1)
        self.stage_index_to_group_rank = {i: i % size for i in range(n_stages)}


def pipeline_order(name, pp, v, m):
    cls = S.get_schedule_class(name)
    loss = lambda out, target: out.sum()
    if issubclass(cls, S.PipelineScheduleSingle):
        sched = cls(StandInStage(0, pp, 0, pp), m, loss_fn=loss)
    else:
        sched = cls([StandInStage(k * pp, pp * v, 0, pp) for k in range(v)], m, loss_fn=loss)
    return sched.pipeline_order


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for spec in sys.argv[2:]:
        name, pp, v, m = spec.split(":")
        path = os.path.join(out, f"{name}-{pp}-{v}-{m}.txt")
        try:
            order = pipeline_order(name, int(pp), int(v), int(m))
        except ValueError as e:  # sizes PyTorch does not accept (e.g. 1F1B with m < pp)
            with open(path, "w") as f:
                f.write(f"refused: {e}\n")
            continue
        with open(path, "w") as f:
            for rank in sorted(order):
                acts = [a for a in order[rank] if a is not None
                        and a.computation_type.value in ("F", "B", "I", "W")]
                fwd = [a.microbatch_index for a in acts if a.computation_type.value == "F"]
                if name == "1F1B" and fwd == list(range(1, int(m) + 1)):
                    # PyTorch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's
                    # forwards 1..m (it increments before its first forward when the warm-up
                    # is empty); its runtime (_step_microbatches) runs 0..m-1. Compare with
                    # what runs.
                    acts = [a._replace(microbatch_index=a.microbatch_index - 1)
                            if a.computation_type.value == "F" else a for a in acts]
                acts = [str(a) for a in acts]
                f.write(f"rank {rank}: {' '.join(acts)}\n")


if __name__ == "__main__":
    main()
