"""The ``gradientmail simulate`` command line.

gradientmail simulate --table [--json] [--seed N] [--days D]
gradientmail simulate --sweep M|H|fragments|quorum|latency [--out DIR] [--seed N] [--days D]
gradientmail simulate --sweep capacity [--nic-gbps G] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gradientmail.simulate.capacity import run_capacity
from gradientmail.simulate.model import Model
from gradientmail.simulate.sweep import SWEEPS, run_sweep
from gradientmail.simulate.table import TABLE_DAYS, format_table, json_rows, table

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--table", action="store_true", help="Decoupled DiLoCo's Table 1, simulated beside the paper's")
    what.add_argument(
        "--sweep",
        choices=[*sorted(SWEEPS), "capacity"],
        help="goodput, S3 requests/s and $/day against one parameter; capacity: the largest M each syncer layout sustains",
    )
    parser.add_argument("--json", action="store_true", help="with --table: print only the simulated rows as JSON")
    parser.add_argument("--out", default="simulate-out", help="with --sweep: folder for sweep_<name>.json and .png")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same numbers)")
    parser.add_argument("--nic-gbps", type=float, default=10.0, help="with --sweep capacity: every node's NIC, Gbit/s")
    parser.add_argument("--days", type=float, default=None, help=f"simulated days per point (table {TABLE_DAYS:g}, sweeps 2)")


def run(args: argparse.Namespace) -> int:
    if args.days is not None and not args.days > 0:
        print(f"gradientmail simulate: --days must be positive, got {args.days:g}", file=sys.stderr)
        return 2
    model = Model()
    if args.table:
        rows = table(model, seed=args.seed, days=args.days if args.days is not None else TABLE_DAYS)
        print(json.dumps(json_rows(rows)) if args.json else format_table(rows, model))
        return 0
    out = Path(args.out)
    if args.sweep == "capacity":
        if not args.nic_gbps > 0:
            print(f"gradientmail simulate: --nic-gbps must be positive, got {args.nic_gbps:g}", file=sys.stderr)
            return 2
        data = run_capacity(out, model=model, nic_bps=args.nic_gbps * 1e9 / 8)
        print(json.dumps(data, indent=1))
        print(f"wrote {out / 'sweep_capacity.json'} and {out / 'sweep_capacity.png'}", file=sys.stderr)
        return 0
    data = run_sweep(args.sweep, out, model=model, seed=args.seed, days=args.days if args.days is not None else 2.0)
    print(json.dumps(data, indent=1))
    print(f"wrote {out / f'sweep_{args.sweep}.json'} and {out / f'sweep_{args.sweep}.png'}", file=sys.stderr)
    return 0
