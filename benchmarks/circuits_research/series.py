import json, re, sys
import numpy as np
from lib import SEEDS
closed = json.load(open("/work/tmp/circuits/closed.json"))
base = json.load(open("/work/tmp/circuits/baselines.json"))
name = sys.argv[1]
for seed in map(str, SEEDS):
    rec = closed[seed]; steps = sorted(map(int, rec)); fb = base[seed][str(steps[-1])]
    pt = int(np.argmax(fb["prev"])); ind = [h for h in range(4) if fb["ind"][h] > 0.4]
    print("seed", seed, "PT", pt)
    for s in steps:
        z = np.array(rec[str(s)][name])
        mask = np.ones_like(z, bool); mask[pt, ind] = False
        ii = [round(base[seed][str(s)].get("ind", [0]*4)[b], 2) for b in ind]
        print(f"  {s:4d} PT->ind {np.round(z[pt, ind], 1)} others max {z[mask].max():.1f} median {np.median(z[mask]):.1f}  ind {ii}")
