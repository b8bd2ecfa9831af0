"""Which GSM-Symbolic templates are MGSM items: compute the mapping, print it for a check by eye.

    python bench/mgsm_overlap.py            # print every match with both texts
    python bench/mgsm_overlap.py --write    # also (re)write layerswap_core/resources/mgsm_overlap.json

Recipe (``data.compute_mgsm_overlap``): each English template's stored question (its original
instantiation) against the 250 MGSM English rows, difflib ratio over lower-case word sequences,
a match at >= 0.8. Needs the MGSM TSVs (--data-dir, $LAYERSWAP_MGSM_DIR or ../shared/data/mgsm).
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layerswap_core.evaluation import data  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--write", action="store_true", help=f"write {data.OVERLAP_FILE}")
    a = p.parse_args()
    en = data.load_mgsm("en", a.data_dir)
    result = data.compute_mgsm_overlap(en)
    folder = data.symbolic_root() / "eng" / "symbolic"
    for o in result["overlaps"]:
        with (folder / f"{o['template']:04d}.toml").open("rb") as f:
            question = tomllib.load(f)["question"].strip()
        agree = "id_orig agrees" if o["id_orig"] == o["mgsm_row"] else f"id_orig {o['id_orig']}!"
        print(f"template {o['template']:04d} -> MGSM row {o['mgsm_row']:3d}  score {o['score']:.3f}  "
              f"({agree})\n  template: {question}\n  MGSM:     {en[o['mgsm_row']].question}\n")
    train = [o["template"] for o in result["overlaps"] if o["template"] in data.SYMBOLIC_TRAIN]
    print(f"{len(result['overlaps'])} templates are MGSM items ({len(train)} in the training range "
          f"0000-0049: {', '.join(f'{t:04d}' for t in train)}); best non-match score "
          f"{result['best_non_match_score']:.3f}, threshold {result['threshold']}")
    if a.write:
        data.OVERLAP_FILE.parent.mkdir(parents=True, exist_ok=True)
        data.OVERLAP_FILE.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {data.OVERLAP_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
