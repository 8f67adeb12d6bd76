"""Tables of REPORT.md from results.json."""
import json
import numpy as np

R = json.load(open("/work/tmp/circuits/results.json"))
SEEDS = ["1337", "1", "2"]


def strongest_from(series, steps, pt, b):
    s_from = None
    for s in reversed(steps):
        if int(np.argmax(np.array(series[str(s)])[:, b])) != pt:
            break
        s_from = s
    return s_from


names = list(R["1337"]["series"]["0"].keys())
print("## baselines\n")
print("| baseline | seed | (a) argmax = PT at 1000 | (b) PT strongest from step (Δ phase) | PT→ind value at 1000 | largest other pair at 1000 | PT→ind just before phase | largest pair at step 50 |")
print("|---|---|---|---|---|---|---|---|")
for name in names:
    for seed in SEEDS:
        r = R[seed]
        steps = sorted(map(int, r["series"]))
        pt, ind, phase = r["pt"], r["ind"], r["phase"]
        fin = np.array(r["series"][str(steps[-1])][name])
        a = all(int(np.argmax(fin[:, b])) == pt for b in ind)
        became = [strongest_from({k: v[name] for k, v in r["series"].items()}, steps, pt, b) for b in ind]
        ok = all(x is not None and abs(x - phase) <= 50 for x in became)
        mask = np.ones_like(fin, bool); mask[pt, ind] = False
        before = np.array(r["series"][str(phase - 50)][name])
        s50 = np.array(r["series"]["50"][name])
        fmt = lambda v: " / ".join(f"{x:.3g}" for x in v)
        print(f"| {name} | {seed} | {'yes' if a else 'NO'} | {', '.join(f'{x}' for x in became)} ({'ok' if ok else 'FAIL'}) |"
              f" {fmt(fin[pt, ind])} | {fin[mask].max():.3g} | {fmt(before[pt, ind])} | {s50.max():.3g} |")

print("\n## path ablation K at 1000\n")
for seed in SEEDS:
    r = R[seed]
    pt = r["pt"]
    print(f"seed {seed}: PT L0.H{pt}; phase {r['phase']}; {r['summary']}")
    for b in r["ind"]:
        intact = r["roles"]["induction"][1][b]
        d = np.array(r["path"]["k"][str(b)]["induction"])
        others = np.delete(d, pt)
        print(f"  L1.H{b} intact {intact:.2f}: Δind per L0 head {np.round(d, 3).tolist()}  PT {d[pt]:.3f} ({-d[pt]/intact:.0%} of it),"
              f" largest other {others.min():.3f}; PT lowers most: {d[pt] < others.min()}; by half: {-d[pt] >= intact / 2}"
              f"  dloss {np.round(r['path']['k'][str(b)]['dloss'], 3).tolist()}")

print("\n## path ablation series (PT -> induction heads, K, Δinduction)\n")
for seed in SEEDS:
    r = R[seed]
    print(seed, "phase", r["phase"])
    for s in sorted(map(int, r["path_series"])):
        if abs(s - r["phase"]) <= 150 or s == 1000:
            row = r["path_series"][str(s)]
            print("  ", s, {b: round(v[r["pt"]], 3) for b, v in row.items()}, "z", {b: round(r["series"][str(s)]["rotation z, all Δ (chosen)"][r["pt"]][int(b)], 1) for b in row})

print("\n## heads of layer 0\n")
for seed in SEEDS:
    r = R[seed]
    print(f"seed {seed}")
    for h in range(4):
        roles = {k: round(v[0][h], 2) for k, v in r["roles"].items()}
        print(f"  L0.H{h}: roles {roles} self {r['self_weight'][h]:.2f} ablation(probe text) {r['ablation'][0][h]:.2f} ablation(64 windows) {r['ablation_long'][0][h]:.2f}"
              f" DLA {r['dla_heads'][0][h]:+.3f} DLA(rel mean) {r['dla_rel_heads'][0][h]:+.3f}")
        for kind in "qkv":
            z = np.round(np.array(r["z"][kind])[h], 1).tolist()
            dind = [round(r["path"][kind][str(b)]["induction"][h], 3) for b in range(4)]
            dl = [round(r["path"][kind][str(b)]["dloss"][h], 3) for b in range(4)]
            print(f"     {kind}: z into L1.H0-3 {z}  path Δind {dind}  path Δloss {dl} (sum {sum(dl):.2f})")
        print("     promotes:", [(e["token"], round(e["attention"], 2), [(t, round(p, 2)) for t, p in e["promoted"]]) for e in r["promoted"][str(h)][:3]])
    print("  L1 DLA", np.round(r["dla_heads"][1], 3).tolist(), "rel", np.round(r["dla_rel_heads"][1], 3).tolist(),
          "mlp", np.round(r["dla_other"]["mlp"], 3).tolist(), "emb", round(r["dla_other"]["embedding"], 3), "logit", round(r["dla_other"]["logit"], 3),
          "rel logit", round(r["dla_rel_other"]["logit"], 3))
