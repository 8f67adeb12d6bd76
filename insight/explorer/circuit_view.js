// attngpt attention explorer, the Circuit tab: every head of the model a node (a row per layer, layer 0 on top),
// and for each target head its strongest sources by composition z per kind (Q, K, V: colour and dash) as edges,
// width and opacity by z; only edges with z at least the shown threshold, and the chosen number per target.
// A click on a head shows its panel: roles, ablation cost, direct logit attribution, the line of what it does
// (insight/describe.py), its inputs and outputs with path ablation's Δ, and the tokens its OV circuit promotes.
// explorer.js builds it with window.attnCircuitView(shared helpers) when the page has M.circuit.
window.attnCircuitView = function (x) {
  "use strict";
  const { $, el, M, fmt, H, SVG_NS } = x;
  const C = M.circuit, NL = C.n_layer;
  const KIND = { q: { name: "Q", colour: "#1f77b4", dash: "", reads: "queries" },
                 k: { name: "K", colour: "#d62728", dash: "6 3", reads: "keys" },
                 v: { name: "V", colour: "#2ca02c", dash: "2 3", reads: "values" } };
  const ROLE_NAMES = ["prev_token", "duplicate_token", "induction"], ROLE_SHORT = ["prev", "dup", "ind"];
  const GAP_X = Math.max(34, Math.min(64, 760 / H)), GAP_Y = 86, PAD = 44, R = 11;
  const st = { kinds: new Set(C.kinds), perTarget: 1, zMin: C.edge_z_min, open: null };
  // edges as objects: [kind, la, a, lb, b, z, score, Δloss, Δprev, Δdup, Δind], z null = NaN or +inf
  const edges = C.edges.map(([k, la, a, lb, b, z, score, dloss, ...roles]) => ({
    kind: C.kinds[k], la, a, lb, b, z: z === null ? NaN : z, score, dloss, roles }));
  // an edge's rank among its target's sources of the same kind (0 = the largest z): the edges come in that order
  const seen = {};
  for (const e of edges) {
    const key = `${e.kind}.${e.lb}.${e.b}`;
    e.rank = seen[key] = key in seen ? seen[key] + 1 : 0;
  }
  const nodeX = (h) => PAD + h * GAP_X, nodeY = (L) => PAD / 2 + L * GAP_Y;
  const name = (L, h) => `L${L}.H${h}`;
  const missing = (v) => v === null || v === undefined || Number.isNaN(v);
  const num = (v, d = 2) => (missing(v) ? "–" : fmt(v, d));
  const signed = (v, d = 2) => (missing(v) ? "–" : (v > 0 ? "+" : "") + v.toFixed(d));
  const zText = (z) => (Number.isNaN(z) ? "∞ or –" : z.toFixed(1));
  const roleOf = (L, h) => (M.roles[L] && M.roles[L][h]) || "";

  // the largest role change of an edge's target, as [short name, Δ] (null when none was measured)
  function roleChange(e) {
    let best = null;
    e.roles.forEach((d, i) => {
      if (d !== null && (!best || Math.abs(d) > Math.abs(best[1]))) best = [ROLE_SHORT[i], d];
    });
    return best;
  }
  const shown = (e) => st.kinds.has(e.kind) && e.rank < st.perTarget && !(e.z < st.zMin); // +inf (NaN here) passes

  function build() {
    const controls = $("circuit-controls");
    for (const k of C.kinds) {
      const cb = el("input", { type: "checkbox", id: `circuit-kind-${k}` });
      cb.checked = true;
      cb.addEventListener("change", () => { cb.checked ? st.kinds.add(k) : st.kinds.delete(k); draw(); });
      const sw = el("span", { class: "kind-swatch" });
      sw.style.borderTop = `3px ${KIND[k].dash ? (k === "k" ? "dashed" : "dotted") : "solid"} ${KIND[k].colour}`;
      const title = `${KIND[k].name}-composition: a source's write read by the target's ${KIND[k].reads}`;
      controls.append(el("label", { title }, [cb, sw, KIND[k].name]));
    }
    const per = el("select", { id: "circuit-per-target" });
    for (let n = 1; n <= C.top_sources; n++) per.append(el("option", { value: n }, n));
    per.addEventListener("change", () => { st.perTarget = +per.value; draw(); });
    const zMin = el("input", { type: "number", id: "circuit-z-min", step: "any", value: C.edge_z_min,
                               style: "width:5em" });
    zMin.addEventListener("change", () => {
      st.zMin = Number.isFinite(+zMin.value) ? +zMin.value : -Infinity;
      draw();
    });
    controls.append(el("label", {}, ["sources per target ", per]), el("label", {}, ["z ≥ ", zMin]));
    $("circuit-hint").textContent = `Each target head's strongest sources by composition z (against a random ` +
      `rotation of the residual stream), per kind: Q solid, K dashed, V dotted; width and opacity ∝ z. Path ` +
      `ablation was run on each target's top ${C.top_sources} per kind. Click a head.`;
    $("circuit-note").textContent = C.note + ".";
    const svg = $("circuit-svg");
    const width = PAD * 2 + (H - 1) * GAP_X, height = PAD + (NL - 1) * GAP_Y;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    draw();
  }

  function draw() {
    const svg = $("circuit-svg");
    svg.replaceChildren();
    const drawn = edges.filter(shown);
    const top = Math.max(1, ...drawn.map((e) => (Number.isNaN(e.z) ? 0 : e.z)));
    const layerLabels = [];
    for (let L = 0; L < NL; L++) {
      layerLabels.push(el("text", { x: 2, y: nodeY(L) + 4, class: "circuit-layer" }, "L" + L, SVG_NS));
    }
    svg.append(...layerLabels);
    const offset = { q: -1, k: 0, v: 1 }; // kinds of one pair bow apart
    for (const e of drawn) {
      const x1 = nodeX(e.a), y1 = nodeY(e.la) + R, x2 = nodeX(e.b), y2 = nodeY(e.lb) - R;
      const bow = offset[e.kind] * 14 + (x1 === x2 ? 10 : 0), my = (y1 + y2) / 2;
      const strength = Number.isNaN(e.z) ? 1 : e.z / top;
      const open = st.open && ((e.la === st.open[0] && e.a === st.open[1]) ||
                               (e.lb === st.open[0] && e.b === st.open[1]));
      svg.append(el("path", {
        d: `M ${x1} ${y1} C ${x1 + bow} ${my}, ${x2 + bow} ${my}, ${x2} ${y2}`, fill: "none",
        stroke: KIND[e.kind].colour,
        "stroke-dasharray": KIND[e.kind].dash, "stroke-width": (1 + 4 * strength).toFixed(2),
        "stroke-opacity": (st.open && !open ? 0.08 : 0.25 + 0.75 * strength).toFixed(3), class: "circuit-edge",
        "data-kind": e.kind, "data-source": `${e.la}.${e.a}`, "data-target": `${e.lb}.${e.b}`, "data-z": e.z },
        [el("title", {}, `${name(e.la, e.a)} → ${name(e.lb, e.b)}'s ${KIND[e.kind].reads}: z ${zText(e.z)}`,
            SVG_NS)], SVG_NS));
    }
    for (let L = 0; L < NL; L++) for (let h = 0; h < H; h++) {
      const role = roleOf(L, h), open = st.open && st.open[0] === L && st.open[1] === h;
      const g = el("g", { class: "circuit-node" + (open ? " open" : "") + (role ? " has-role" : ""),
                          id: `circuit-node-${L}-${h}`, "data-layer": L, "data-head": h }, [
        el("circle", { cx: nodeX(h), cy: nodeY(L), r: R }, undefined, SVG_NS),
        el("text", { x: nodeX(h), y: nodeY(L) + 4, "text-anchor": "middle" }, String(h), SVG_NS),
        el("title", {}, `${name(L, h)}${role ? " · " + role : ""}: ${C.descriptions[L][h]}`, SVG_NS)], SVG_NS);
      g.addEventListener("click", () => openHead(L, h));
      svg.append(g);
    }
  }

  function table(id, head, rows) {
    const thead = el("thead", {}, [el("tr", {}, head.map((c) => el("th", {}, c)))]);
    return el("table", { id, class: "circuit-table" }, [thead, el("tbody", {}, rows)]);
  }
  function edgeRow(e, other) {
    const change = roleChange(e);
    return el("tr", { "data-kind": e.kind, "data-source": `${e.la}.${e.a}`, "data-target": `${e.lb}.${e.b}`,
                      "data-z": e.z, "data-dloss": e.dloss ?? NaN }, [
      el("td", { class: "circuit-other" }, other), el("td", {}, KIND[e.kind].name), el("td", {}, zText(e.z)),
      el("td", {}, num(e.score, 3)), el("td", {}, signed(e.dloss)),
      el("td", {}, change ? `${change[0]} ${signed(change[1])}` : "–")]);
  }

  function openHead(L, h) {
    st.open = [L, h];
    draw();
    const panel = $("circuit-panel");
    panel.classList.remove("hidden");
    const ablation = M.scores.ablation_dloss && M.scores.ablation_dloss[L] ? M.scores.ablation_dloss[L][h] : null;
    const roles = ROLE_NAMES.filter((r) => M.scores[r] && M.scores[r][L])
      .map((r) => `${ROLE_SHORT[ROLE_NAMES.indexOf(r)]} ${num(M.scores[r][L][h], 3)}`).join(", ");
    const inputs = edges.filter((e) => e.lb === L && e.b === h)
      .sort((p, q) => (Number.isNaN(q.z) ? Infinity : q.z) - (Number.isNaN(p.z) ? Infinity : p.z));
    const outputs = edges.filter((e) => e.la === L && e.a === h)
      .sort((p, q) => (Number.isNaN(q.z) ? Infinity : q.z) - (Number.isNaN(p.z) ? Infinity : p.z)).slice(0, 12);
    const cols = (who) => [who, "kind", "z", "score", "path Δloss", "path Δrole"];
    const ov = C.ov[L][h].map(([token, share, promoted]) => el("tr", {}, [
      el("td", { class: "tokcell" }, token), el("td", {}, num(share, 3)),
      el("td", { class: "tokcell promoted" }, promoted.map(([t, v]) => `${t} ${signed(v)}`).join("  "))]));
    const body = [
      el("h3", { id: "circuit-title" }, `${name(L, h)}${roleOf(L, h) ? " · " + roleOf(L, h) : ""}`),
      el("p", { id: "circuit-desc" }, C.descriptions[L][h]),
      el("p", { id: "circuit-facts", class: "hint" },
         `roles: ${roles || "not measured"} · ablation Δloss ${signed(ablation)} nats · direct logit ` +
         `${signed(C.direct_logit[L][h])} (correct token minus the mean logit, mean over the prompt)`),
      el("h4", {}, "Inputs: its strongest sources"),
      inputs.length ? table("circuit-inputs", cols("source"), inputs.map((e) => edgeRow(e, name(e.la, e.a))))
                    : el("p", { class: "hint", id: "circuit-inputs" }, "none: layer 0 reads no earlier head"),
      el("h4", {}, "Outputs: heads that count it among their strongest sources"),
      outputs.length ? table("circuit-outputs", cols("target"), outputs.map((e) => edgeRow(e, name(e.lb, e.b))))
                     : el("p", { class: "hint", id: "circuit-outputs" }, "none"),
      el("h4", {}, "What its OV circuit writes: tokens it attends to most → the tokens that write promotes"),
      ov.length ? table("circuit-ov", ["attended", "share", "promotes (direct logit per unit of attention)"], ov)
                : el("p", { class: "hint", id: "circuit-ov" }, "no attention recorded")];
    if (M.layers.includes(L)) {
      const button = el("button", { id: "circuit-to-head" }, "show its attention");
      button.addEventListener("click", () => x.openHead(L, h));
      body.push(button);
    }
    panel.replaceChildren(...body);
  }

  return { build, openHead };
};
