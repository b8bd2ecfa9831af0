"""Teacher-forced NLL of held-out data for the demo: base, experts, layer swap, uniform soup.

    python bench/demo_nll.py [--limit N]

Held-out sets (never trained on): English and Swahili worked solutions of GSM-Symbolic templates
0050-0099, and the Swahili expert's held-out split (Swahili questions of templates 0050-0099 and
10% of the FreeDict entries). Mean NLL per response token, float32, CPU.
"""
import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from layerswap_core.demos.heldout import DEMO_ROWS, demo_nll_table, table_markdown  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--limit", type=int, help="first N items of each set")
p.add_argument("--json", help="also write the table here")
p.add_argument("--rows", default=",".join(DEMO_ROWS), help="subset of: " + ", ".join(DEMO_ROWS))
a = p.parse_args()
t0 = time.time()


def save_row(label, row):
    print(f"{label}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
    if a.json:
        done = json.load(open(a.json)) if os.path.exists(a.json) else {}
        done[label] = row
        with open(a.json, "w") as f:
            json.dump(done, f, indent=1)


table = demo_nll_table(a.limit, rows=[r.strip() for r in a.rows.split(",")], on_row=save_row,
                       progress=lambda m: print(f"[{time.time() - t0:5.0f} s] {m}", flush=True))
print(table_markdown(table))
print(f"({time.time() - t0:.0f} s)")
