#!/usr/bin/env python3
"""How closely one training run's loss curve follows another's.

    bench/loss_agreement.py REFERENCE/metrics.csv OTHER/metrics.csv [--from STEP] [--every N] [--smooth K] [--column eval_loss]

Reads the `step,loss,...` CSV that `mlx-llama train` writes next to its
checkpoints, and prints, for the steps both runs logged from `--from` on
(default 1), the largest relative difference |other - reference| /
reference, where it happened, the mean, and a table every `--every` steps.
`--smooth K` compares the means of each run's last K logged losses
(a trailing window, as a loss-curve plot's smoothing) instead of single
steps. `--column eval_loss` compares the validation losses instead.

Either side may be several runs, comma-separated (the same setting from
several seeds): each step's loss is then their mean, and the table also
gives the spread (largest minus smallest) of each side's runs, the signed
difference of the means in standard errors (the standard error of a
difference of two means: sqrt(s1^2/n1 + s2^2/n2), s the runs' sample
standard deviation; with two or more runs a side), and the summary counts
the steps where the other side's mean is above the reference's.
Exits 1 if the runs share no step.
"""

import argparse
import csv
import math
import sys


def losses(path, column):
    with open(path, newline="") as f:
        return {int(r["step"]): float(r[column]) for r in csv.DictReader(f) if r[column]}


def smooth(by_step, k):
    """Each step's mean over the trailing window of `k` logged steps."""
    steps = sorted(by_step)
    return {
        s: sum(by_step[t] for t in steps[max(0, i - k + 1) : i + 1]) / (i + 1 - max(0, i - k + 1))
        for i, s in enumerate(steps)
    }


def side(paths, column, k):
    """The mean over runs of each step all of them logged, the spread, and
    the squared standard error of the mean (0 for one run)."""
    runs = [smooth(losses(p, column), k) for p in paths.split(",")]
    n = len(runs)
    steps = set.intersection(*(set(r) for r in runs))
    mean = {s: sum(r[s] for r in runs) / n for s in steps}
    spread = {s: max(r[s] for r in runs) - min(r[s] for r in runs) for s in steps}
    se2 = {
        s: sum((r[s] - mean[s]) ** 2 for r in runs) / (n - 1) / n if n > 1 else 0.0
        for s in steps
    }
    return mean, spread, se2, n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("other")
    p.add_argument("--from", dest="start", type=int, default=1)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--smooth", type=int, default=1)
    p.add_argument("--column", default="loss")
    a = p.parse_args()
    ref, ref_spread, ref_se2, nr = side(a.reference, a.column, a.smooth)
    other, other_spread, other_se2, no = side(a.other, a.column, a.smooth)
    steps = sorted(s for s in ref.keys() & other.keys() if s >= a.start)
    if not steps:
        sys.exit(f"no step from {a.start} on is in both {a.reference} and {a.other}")
    rel = {s: abs(other[s] - ref[s]) / abs(ref[s]) for s in steps}
    worst = max(steps, key=rel.get)
    several = nr > 1 or no > 1
    errors = nr > 1 and no > 1

    def in_errors(s):
        se = math.sqrt(ref_se2[s] + other_se2[s])
        return f"{(other[s] - ref[s]) / se:+.2f}" if se > 0 else "-"

    if several:
        print(
            f"| step | reference mean of {nr} | spread | other mean of {no} | spread | "
            "relative difference | difference / std. error |"
        )
        print("|---|---|---|---|---|---|---|")
    else:
        print("| step | reference loss | other loss | relative difference |")
        print("|---|---|---|---|")
    for s in steps:
        if s % a.every == 0 or s == steps[0] or s == steps[-1] or s == worst:
            if several:
                print(
                    f"| {s} | {ref[s]:.4f} | {ref_spread[s]:.4f} | {other[s]:.4f} | "
                    f"{other_spread[s]:.4f} | {100 * (other[s] - ref[s]) / abs(ref[s]):+.2f}% | "
                    f"{in_errors(s) if errors else '-'} |"
                )
            else:
                print(f"| {s} | {ref[s]:.4f} | {other[s]:.4f} | {100 * rel[s]:.2f}% |")
    mean = sum(rel.values()) / len(rel)
    print(
        f"\nsteps {steps[0]}-{steps[-1]} ({len(steps)}): largest relative difference "
        f"{100 * rel[worst]:.2f}% at step {worst}, mean {100 * mean:.2f}%"
    )
    if several:
        above = sum(other[s] > ref[s] for s in steps)
        print(f"the other mean is above the reference's at {above} of {len(steps)} steps")


if __name__ == "__main__":
    main()
