import json
import numpy as np
R = json.load(open("/work/tmp/circuits/results.json"))
names = list(R["1337"]["series"]["0"].keys())
def auc(pos, neg):
    pos, neg = np.asarray(pos), np.asarray(neg)
    return float(((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg)))
def ranks(x):
    return np.argsort(np.argsort(x))
print("| baseline | AUC, causal K pairs (path Δinduction ≤ -0.1) vs the rest, 3 seeds pooled | Spearman with -Δinduction, pooled | AUC within each seed (1337, 1, 2) |")
print("|---|---|---|---|")
for name in names:
    pos, neg, xs, ys, per = [], [], [], [], []
    for seed in ("1337", "1", "2"):
        r = R[seed]; fin = np.array(r["series"]["1000"][name]); p, n_ = [], []
        for b in r["ind"]:
            d = np.array(r["path"]["k"][str(b)]["induction"])
            for a in range(4):
                (p if d[a] <= -0.1 else n_).append(fin[a, b]); xs.append(fin[a, b]); ys.append(-d[a])
        pos += p; neg += n_; per.append(auc(p, n_))
    rho = np.corrcoef(ranks(np.array(xs)), ranks(np.array(ys)))[0, 1]
    print(f"| {name} | {auc(pos, neg):.3f} ({len(pos)} causal, {len(neg)} not) | {rho:.2f} | {', '.join(f'{x:.2f}' for x in per)} |")
