"""Test helper: two metrics files (hyperpar-train --metrics) agree step for step.

  metrics_match.py A B [--steps 4,5,6] [--tol 1e-5]

loss, grad_norm and val_loss (where both have it) must agree within tol (absolute; the
losses are O(1..6) nats, so this is also ~1e-5 relative). Both files must have the steps
compared, and the same set of val_loss steps. Exit 1 with the worst difference otherwise.
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--steps")
ap.add_argument("--tol", type=float, default=1e-5)
args = ap.parse_args()
load = lambda p: {m["step"]: m for m in map(json.loads, open(p))}
a, b = load(args.a), load(args.b)
steps = [int(s) for s in args.steps.split(",")] if args.steps else sorted(a)
worst, where = 0.0, None
for s in steps:
    if s not in a or s not in b:
        sys.exit(f"metrics_match: step {s} missing ({args.a}: {s in a}, {args.b}: {s in b})")
    if ("val_loss" in a[s]) != ("val_loss" in b[s]):
        sys.exit(f"metrics_match: step {s}: val_loss in only one file")
    for k in ("loss", "grad_norm", "val_loss"):
        if k in a[s]:
            d = abs(a[s][k] - b[s][k])
            if d > worst:
                worst, where = d, (s, k)
print(f"metrics_match: {len(steps)} steps, largest difference {worst:.3e} at {where} "
      f"(limit {args.tol})")
sys.exit(0 if worst <= args.tol else 1)
