// attngpt attention explorer, the Statistics tab: one row per head, what each head does (the role scores
// and the ablation Δloss, for every layer of the model when the page was given them) beside the statistics
// of its map (over the tokens shown), a role label by the thresholds the page states, sorted by any
// column (click its header; again to reverse), a click on a row opens the head.
// explorer.js builds it with window.attnStatsView(shared helpers) once the data is decoded.
window.attnStatsView = function (x) {
  "use strict";
  const { $, el, M, st, fmt, H } = x;
  const LABELS = { role: "role", prev_token: "prev-token", duplicate_token: "duplicate", induction: "induction",
                   ablation_dloss: "Δloss", entropy: "entropy", sink_mass: "sink mass", mean_distance: "distance",
                   decay_gamma: "γ", decay_r2: "γ fit R²" };
  const TITLES = {
    role: "the first role whose score passes its threshold (below the table)",
    prev_token: "mean α_{i,i−1}: weight on the previous token",
    duplicate_token: "role probe: mean weight from the second copy's query i to i − R, its own token's earlier occurrence",
    induction: "role probe: mean weight from the second copy's query i to i − R + 1, the token that followed it",
    ablation_dloss: "next-token loss with this head's output zeroed minus the intact loss (nats): > 0 = the model needs it",
    entropy: "mean normalised entropy of a query's weights: 1 = uniform, 0 = one key",
    sink_mass: "mean weight on the first token", mean_distance: "mean Σ_j α_ij (i − j), in tokens",
    decay_gamma: "γ of the fit m(d) ∝ d^−γ of the mean weight at distance d (key 0 left out)",
    decay_r2: "R² of γ's log-log fit: 1 = a power law, near 0 = γ says little" };
  const hasScores = M.score_names.length > 0;
  const cols = ["layer", "head", ...(hasScores ? ["role"] : []), ...M.score_names, ...M.stat_names];
  const layers = [...new Set([...M.layers, ...M.roles.map((_, L) => L)])].sort((a, b) => a - b);
  const rows = [];
  for (const L of layers) for (let h = 0; h < H; h++) {
    const r = { layer: L, head: h, role: hasScores && M.roles[L] ? M.roles[L][h] : "", inFile: M.layers.includes(L) };
    for (const s of M.score_names) r[s] = M.scores[s][L] ? M.scores[s][L][h] ?? NaN : NaN; // null in the JSON: NaN
    for (const s of M.stat_names) r[s] = r.inFile ? M.stats[L][s][h] ?? NaN : NaN;
    rows.push(r);
  }

  function build() {
    $("stats-table").tHead.append(el("tr", {}, cols.map((c) => {
      const th = el("th", { "data-col": c, title: TITLES[c] || c }, LABELS[c] || c);
      th.addEventListener("click", () => {
        st.sort = { key: c, dir: st.sort.key === c ? -st.sort.dir : 1 };
        render();
      });
      return th;
    })));
    const legend = $("stats-legend");
    if (hasScores) {
      const rules = M.role_rules.map(([name, score, t]) => `${name} when ${LABELS[score]} > ${t}`).join(", else ");
      legend.textContent = `Role: ${rules}; else none (insight/roles.py). ${M.scores_note ? M.scores_note + "." : ""}`;
    } else legend.textContent = "Role scores and ablation were not computed for this page (sample.py --dump-attn computes them).";
    render();
  }

  // Numbers ascending (dir 1) or descending; roles alphabetically; missing values (NaN, no role) always last.
  function compare(a, b, key, dir) {
    const x = a[key], y = b[key];
    if (key === "role") return !x || !y ? (!x) - (!y) : dir * x.localeCompare(y);
    if (Number.isNaN(x) || Number.isNaN(y)) return Number.isNaN(x) - Number.isNaN(y);
    return dir * (x - y);
  }
  function render() {
    const { key, dir } = st.sort;
    const sorted = key ? [...rows].sort((a, b) => compare(a, b, key, dir) || a.layer - b.layer || a.head - b.head) : rows;
    for (const th of document.querySelectorAll("#stats-table th")) {
      th.dataset.sort = th.dataset.col === key ? (dir > 0 ? "asc" : "desc") : "";
    }
    const td = (col, value, text) => el("td", { "data-col": col, "data-value": value }, text);
    $("stats-table").tBodies[0].replaceChildren(...sorted.map((r) => {
      const tr = el("tr", { "data-layer": r.layer, "data-head": r.head, class: r.inFile ? "" : "absent" });
      if (!r.inFile) tr.title = `layer ${r.layer}'s maps are not in this file: sample.py --dump-attn ${r.layer}`;
      tr.append(td("layer", r.layer, r.layer), td("head", r.head, r.head));
      if (hasScores) tr.append(el("td", { "data-col": "role", "data-value": r.role, class: "role" }, r.role));
      // scores in fixed point (0.001 reads better than 1.0e-3 beside 0.950); the maps' statistics as before
      for (const s of M.score_names) tr.append(td(s, r[s], Number.isFinite(r[s]) ? r[s].toFixed(3) : "–"));
      for (const s of M.stat_names) tr.append(td(s, r[s], fmt(r[s], 3)));
      if (r.inFile) tr.addEventListener("click", () => x.openHead(r.layer, r.head));
      return tr;
    }));
  }

  return { build, render };
};
