// attngpt attention explorer: a head view, a text view (text_view.js), a model view, the step-by-step
// arithmetic of one query, per-head statistics (stats_view.js) and the circuit (circuit_view.js), over data
// embedded in this very file (insight/explorer/__init__.py writes it). Plain JS, SVG and canvas; nothing is
// fetched. The data: a JSON
// header (#attn-meta) and two base64 gzip blobs, the 8-bit weights (#attn-data) and float32 q, k, v of
// some heads (#attn-detail).
(function () {
  "use strict";
  const SVG_NS = "http://www.w3.org/2000/svg"; // the SVG namespace name: an identifier, never fetched
  const ROW = 18, LINES_W = 240, OPEN_PX = 512;
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  const $ = (id) => document.getElementById(id);
  const M = JSON.parse($("attn-meta").textContent);
  const W = M.window, H = M.n_head, DK = M.head_dim, NREP = M.n_head / M.n_kv_head;
  const TRI = W * (W + 1) / 2; // entries of one head's lower triangle, rows one after the other
  const A = {}, D = {};
  const st = { layer: M.layers[0], heads: new Set(), focus: 0, query: W - 1, key: null, side: "q", hover: null,
               vw: false, textVw: false, opened: null, sort: { key: null, dir: 1 }, tokenView: M.first_view };
  const api = window.attnExplorer = { meta: M, state: st, ready: false, detailReady: false,
                                      marks: { script: performance.now() } }; // ms since navigation began
  let textView = null; // text_view.js, built once the data is decoded (as stats_view.js)

  // ---- data --------------------------------------------------------------------------------------
  // base64 -> bytes: natively where the browser can, else in slices that leave the page responsive
  async function bytesOf(id) {
    const text = $(id).textContent.trim();
    if (!text) return null;
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
    const out = new Uint8Array(text.length / 4 * 3 - (text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0));
    const SLICE = 1 << 20; // base64 characters per slice, a multiple of 4
    for (let start = 0, o = 0; start < text.length; start += SLICE) {
      const bin = atob(text.slice(start, start + SLICE));
      for (let i = 0; i < bin.length; i++) out[o++] = bin.charCodeAt(i);
      await new Promise((resolve) => setTimeout(resolve, 0)); // let the page breathe between slices
    }
    return out;
  }
  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer(); // a Response over a local stream: no request is made
  }
  const TYPES = { uint8: Uint8Array, float32: Float32Array };
  function unpack(buf, specs, into) {
    for (const [name, [offset, dtype, shape]] of Object.entries(specs)) {
      into[name] = new TYPES[dtype](buf, offset, shape.reduce((a, b) => a * b, 1));
    }
  }
  // the 8-bit weight of query i on key j, dequantised: code / 255 * the row's largest weight
  function alpha(L, h, i, j) {
    return j > i ? 0 : A["attn." + L][h * TRI + i * (i + 1) / 2 + j] / 255 * A["scale." + L][h * W + i];
  }
  const vnorm = (L, h, j) => A["vnorm." + L][h * W + j]; // ||v_j W_O^h||
  const colour = (h) => h < PALETTE.length ? PALETTE[h] : `hsl(${(h * 137.5) % 360},65%,42%)`;
  const label = (i) => M.labels[i];
  const roleOf = (L, h) => (M.roles[L] && M.roles[L][h] ? " · " + M.roles[L][h] : ""); // e.g. " · induction"

  function fmt(x, digits = 4) {
    if (x === -Infinity) return "−∞";
    if (!Number.isFinite(x)) return "–";
    const a = Math.abs(x);
    return a !== 0 && (a >= 1e5 || a < 1e-3) ? x.toExponential(digits - 1) : x.toFixed(digits);
  }
  const vec = (v, n) => "[" + Array.from(v.slice(0, n), (x) => fmt(x, 3)).join(", ") + (v.length > n ? ", …" : "") + "]";
  // an element with attributes and its text, or (an array) its children; an SVG one with ns = SVG_NS
  function el(tag, attrs = {}, content, ns) {
    const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (Array.isArray(content)) e.append(...content);
    else if (content !== undefined) e.textContent = content;
    return e;
  }

  // ---- head view ---------------------------------------------------------------------------------
  function buildHeadView() {
    const sel = $("layer-select");
    for (const L of M.layers) sel.append(el("option", { value: L }, "layer " + L));
    sel.addEventListener("change", () => setLayer(+sel.value, M.selected[sel.value]));
    for (const [side, col] of [["q", $("q-col")], ["k", $("k-col")]]) {
      for (let i = 0; i < W; i++) {
        const t = el("div", { class: "tok", id: `${side}-tok-${i}`, title: `${i}: ${label(i)}` }, label(i));
        t.addEventListener("mouseenter", () => { st.hover = { side, index: i }; drawLines(); });
        t.addEventListener("mouseleave", () => { st.hover = null; drawLines(); });
        t.addEventListener("click", () => {
          if (side === "q") pickQuery(i);
          else { st.side = side; st.key = i; drawLines(); }
        });
        col.append(t);
      }
    }
    const svg = $("lines");
    svg.setAttribute("height", W * ROW);
    svg.setAttribute("viewBox", `0 0 ${LINES_W} ${W * ROW}`);
    $("heads-all").addEventListener("click", () => { for (let h = 0; h < H; h++) st.heads.add(h); syncToggles(); drawLines(); });
    $("heads-none").addEventListener("click", () => { st.heads.clear(); syncToggles(); drawLines(); });
    $("value-weighted").addEventListener("change", (e) => { st.vw = e.target.checked; drawLines(); });
    const box = $("head-toggles");
    for (let h = 0; h < H; h++) {
      const cb = el("input", { type: "checkbox", id: `head-toggle-${h}` }), sw = el("span", { class: "swatch" });
      cb.addEventListener("change", () => { cb.checked ? st.heads.add(h) : st.heads.delete(h); drawLines(); });
      sw.style.background = colour(h);
      box.append(el("label", { title: `head ${h}` }, [cb, sw, String(h)]));
    }
  }
  function syncToggles() { for (let h = 0; h < H; h++) $(`head-toggle-${h}`).checked = st.heads.has(h); }
  function setLayer(L, heads, focus) {
    st.layer = L;
    st.heads = new Set(heads);
    st.focus = focus !== undefined ? focus : heads.length ? Math.min(...heads) : 0;
    $("layer-select").value = L;
    syncToggles();
    update();
  }
  // Every view that shows the current layer, head and query, redrawn
  function update() { drawLines(); if (textView) textView.render(); renderStep(); }
  function setFocus(h) { st.focus = h; update(); }
  // Query i chosen (a click, the step view's menu, the keyboard): every view follows, and it stays in sight
  function pickQuery(i) {
    st.query = Math.max(0, Math.min(W - 1, i));
    st.side = "q";
    update();
    revealQuery();
  }
  function revealQuery() {
    const s = $("head-scroll"), top = st.query * ROW;
    if (top < s.scrollTop || top + ROW > s.scrollTop + s.clientHeight) s.scrollTop = Math.max(0, top + 2 * ROW - s.clientHeight);
    if (textView) textView.reveal();
  }

  // Lines from the chosen token: a query's to the keys it attends to, or a key's from the queries that
  // attend to it. Opacity = alpha_ij, or ||alpha_ij v_j W_O^h|| over the largest such value drawn.
  function drawLines() {
    const svg = $("lines");
    svg.replaceChildren();
    for (const t of document.querySelectorAll(".tok.sel")) t.classList.remove("sel");
    const target = st.hover || { side: st.side, index: st.side === "q" ? st.query : st.key };
    if (target.index === null || target.index === undefined) return;
    $(`${target.side}-tok-${target.index}`).classList.add("sel");
    const L = st.layer, lines = [];
    for (const h of [...st.heads].sort((a, b) => a - b)) {
      const [lo, hi] = target.side === "q" ? [0, target.index] : [target.index, W - 1];
      for (let n = lo; n <= hi; n++) {
        const [i, j] = target.side === "q" ? [target.index, n] : [n, target.index];
        const a = alpha(L, h, i, j);
        lines.push([h, i, j, a, st.vw ? a * vnorm(L, h, j) : a]);
      }
    }
    const top = st.vw ? Math.max(1e-30, ...lines.map((l) => l[4])) : 1;
    svg.append(...lines.map(([h, i, j, a, value]) => el("line", {
      x1: 0, y1: (i + 0.5) * ROW, x2: LINES_W, y2: (j + 0.5) * ROW, stroke: colour(h), "stroke-width": 2,
      "stroke-opacity": value / top, class: "attn-line", "data-head": h, "data-query": i, "data-key": j,
      "data-alpha": a, "data-weight": value }, undefined, SVG_NS)));
    const who = target.side === "q" ? `query ${target.index} «${label(target.index)}» attends to (right)`
                                    : `key ${target.index} «${label(target.index)}» is attended by (left)`;
    $("head-hint").textContent = `Layer ${L}: ${who}. Opacity = ` + (st.vw
      ? `‖α_ij · v_j W_O^h‖ / ${fmt(top)}, the largest drawn: what each token adds to the output.`
      : "the weight α_ij (8-bit). Hover a token; click to keep it; ↑/↓ move the query.");
  }

  // ---- model view --------------------------------------------------------------------------------
  const LUT = (() => { // viridis-like, from five stops, interpolated
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const lut = new Uint8Array(256 * 3);
    for (let n = 0; n < 256; n++) {
      const x = n / 255 * 4, k = Math.min(3, Math.floor(x)), f = x - k;
      for (let c = 0; c < 3; c++) lut[n * 3 + c] = Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f);
    }
    return lut;
  })();
  // one head as an S x S image: each pixel the largest weight of the cells it covers, colour ~ sqrt(weight)
  function drawMap(canvas, L, h, S) {
    canvas.width = canvas.height = S;
    const peak = new Float32Array(S * S).fill(-1), codes = A["attn." + L], scale = A["scale." + L];
    const col = Int32Array.from({ length: W }, (_, j) => Math.floor(j * S / W));
    let c = h * TRI; // alpha(L, h, i, j) inlined: this loop runs W * W / 2 times per head
    for (let i = 0; i < W; i++) {
      const r = col[i] * S, unit = scale[h * W + i] / 255;
      for (let j = 0; j <= i; j++, c++) {
        const p = r + col[j], a = codes[c] * unit;
        if (a > peak[p]) peak[p] = a;
      }
    }
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(S, S);
    for (let p = 0; p < S * S; p++) {
      const n = peak[p] < 0 ? -1 : Math.round(Math.sqrt(Math.min(1, peak[p])) * 255) * 3; // -1: the future, grey
      for (let c = 0; c < 3; c++) img.data[p * 4 + c] = n < 0 ? 217 : LUT[n + c];
      img.data[p * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }
  // The small maps are drawn a few at a time after the page is ready (all at once if the tab opens first).
  const pendingMaps = [];
  function drawPendingMaps(budgetMs) {
    const t0 = performance.now();
    while (pendingMaps.length && performance.now() - t0 < budgetMs) pendingMaps.shift()();
    if (pendingMaps.length && budgetMs < Infinity) setTimeout(() => drawPendingMaps(budgetMs), 0);
    else if (!pendingMaps.length) api.modelViewMs = api.modelViewMs || performance.now();
  }
  function buildModelView() {
    const grid = $("model-grid"), S = Math.min(W, 96);
    grid.style.gridTemplateColumns = `54px repeat(${H}, minmax(0, 72px))`; // the maps shrink to fit the pane
    grid.append(el("span"));
    for (let h = 0; h < H; h++) grid.append(el("span", { class: "lbl head", title: "head " + h }, H > 8 ? h : "head " + h));
    for (const L of M.layers) {
      grid.append(el("span", { class: "lbl" }, "layer " + L));
      for (let h = 0; h < H; h++) {
        const c = el("canvas", { class: "thumb", id: `thumb-${L}-${h}`, title: `layer ${L}, head ${h}${roleOf(L, h)}` });
        pendingMaps.push(() => drawMap(c, L, h, S));
        c.addEventListener("click", () => openHead(L, h));
        grid.append(c);
      }
    }
    const big = $("opened-map");
    const cell = (e) => { const r = big.getBoundingClientRect();
      return [Math.min(W - 1, Math.floor((e.clientY - r.top) / r.height * W)),
              Math.min(W - 1, Math.floor((e.clientX - r.left) / r.width * W))]; };
    big.addEventListener("mousemove", (e) => {
      const [L, h] = st.opened, [i, j] = cell(e), a = alpha(L, h, i, j);
      $("opened-readout").textContent = j > i ? `query ${i} «${label(i)}» cannot see key ${j}: the future`
        : `query ${i} «${label(i)}» → key ${j} «${label(j)}»: α = ${fmt(a)}, ‖α · v W_O‖ = ${fmt(a * vnorm(L, h, j))}`;
    });
    big.addEventListener("click", (e) => { const [L, h] = st.opened; st.query = cell(e)[0]; setLayer(L, [h], h); revealQuery(); });
    $("opened-to-head").addEventListener("click", () => { const [L, h] = st.opened; setLayer(L, [h], h); showTab("head"); });
  }
  function openHead(L, h) {
    for (const t of document.querySelectorAll("canvas.thumb.open")) t.classList.remove("open");
    $(`thumb-${L}-${h}`).classList.add("open");
    st.opened = [L, h];
    $("opened").classList.remove("hidden");
    $("opened-title").textContent = `layer ${L}, head ${h}`;
    const big = $("opened-map");
    drawMap(big, L, h, W);
    const px = Math.max(1, Math.floor(OPEN_PX / W)) * W;
    big.style.width = big.style.height = Math.min(px, OPEN_PX * 2) + "px";
    setLayer(L, st.heads, h); // the heads switched on stay as they are
  }
  // A head opened from the Statistics tab: in the head view, or the text view when that is the one in use
  function showHead(L, h) { setLayer(L, [h], h); showTab(st.tokenView); revealQuery(); }

  // ---- step by step ------------------------------------------------------------------------------
  function buildStep() {
    const hs = $("step-head"), qs = $("step-query");
    for (let h = 0; h < H; h++) hs.append(el("option", { value: h }, h));
    for (let i = 0; i < W; i++) qs.append(el("option", { value: i }, `${i}: ${label(i)}`));
    hs.addEventListener("change", () => setFocus(+hs.value));
    qs.addEventListener("change", () => pickQuery(+qs.value));
    $("step-sort").addEventListener("change", renderStep);
    // ↑/↓ (and ←/→ in the text view, where tokens run left to right) move the query
    const STEP = { ArrowUp: -1, ArrowDown: 1, ArrowLeft: -1, ArrowRight: 1 };
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT" || !(e.key in STEP)) return;
      if (e.key.startsWith("ArrowL") || e.key.startsWith("ArrowR")) { if (current !== "text") return; }
      e.preventDefault();
      pickQuery(st.query + STEP[e.key]);
    });
  }
  // The seeds' computation for query i of head h, from the stored float32 q, k, v, in float64.
  function stepNumbers(L, h, i) {
    const g = Math.floor(h / NREP), q = D[`q.${L}.${h}`], k = D[`k.${L}.${g}`], v = D[`v.${L}.${g}`];
    if (!q) return null;
    const qi = q.subarray(i * DK, (i + 1) * DK), root = Math.sqrt(DK);
    const dot = new Float64Array(i + 1), s = new Float64Array(i + 1), e = new Float64Array(i + 1);
    let top = -Infinity, sum = 0;
    for (let j = 0; j <= i; j++) {
      let d = 0;
      for (let c = 0; c < DK; c++) d += qi[c] * k[j * DK + c];
      dot[j] = d; s[j] = d / root; top = Math.max(top, s[j]);
    }
    for (let j = 0; j <= i; j++) { e[j] = Math.exp(s[j] - top); sum += e[j]; }
    const a = Array.from(e, (x) => x / sum), out = new Float64Array(DK);
    for (let j = 0; j <= i; j++) for (let c = 0; c < DK; c++) out[c] += a[j] * v[j * DK + c];
    return { g, qi, k, v, dot, s, e, top, sum, alpha: a, out };
  }
  function renderStep() {
    const L = st.layer, h = st.focus, i = st.query;
    $("step-head").value = h;
    $("step-query").value = i;
    const body = $("step-body");
    body.replaceChildren();
    const head = `Layer ${L}, head ${h}` + (NREP > 1 ? ` (reads kv head ${Math.floor(h / NREP)})` : "");
    body.append(el("p", {}, `${head}, query ${i} «${label(i)}»: d_k = ${DK}, √d_k = ${fmt(Math.sqrt(DK))}.`));
    if (!api.detailReady) { body.append(el("p", { class: "hint" }, "decoding q, k, v…")); return; }
    const n = stepNumbers(L, h, i);
    if (!n) {
      const kept = Object.entries(M.detail_heads).filter(([, hs]) => hs.length)
        .map(([l, hs]) => `layer ${l}: ${hs.join(",")}`).join("; ") || "none";
      body.append(el("p", { class: "note", id: "step-missing" }, `This file keeps float32 q, k, v only for some heads, to ` +
        `stay small (${kept}). For this one, dump it alone: sample.py --dump-attn ${L}:${h}.`));
      return;
    }
    for (const [step, line] of [["scores", "s_j = q·k_j / √d_k,  −∞ for the future (j > i)"],
                                ["softmax", "α_j = softmax(s)_j = exp(s_j − max s) / Σ_j exp(s_j − max s)"],
                                ["weighted sum", "output = Σ_j α_j v_j"]]) {
      body.append(el("div", { class: "formula" }, [el("b", {}, step + ": "), line]));
    }
    body.append(el("p", { class: "vec" }, `q_${i} (after RoPE, as the model uses it) = ${vec(n.qi, 8)}`));
    const cols = ["j", "key", "q·k_j", "÷√d_k = s_j", `exp(s_j − ${fmt(n.top, 3)})`, "softmax α_j", "",
                  "‖α_j v_j W_O‖", "v_j"];
    const tb = el("tbody");
    const row = (attrs, cells) => el("tr", attrs, cells.map((c) => (c instanceof Node ? c : el("td", {}, c))));
    const num = (cls, x, digits) => el("td", { class: cls, "data-value": x }, fmt(x, digits));
    const keys = Array.from({ length: i + 1 }, (_, j) => j);
    if ($("step-sort").checked) keys.sort((x, y) => n.alpha[y] - n.alpha[x]);
    for (const j of keys) {
      const bar = el("td", { class: "bar" }, [el("span")]);
      bar.firstChild.style.width = Math.round(n.alpha[j] * 50) + "px";
      tb.append(row({ "data-key": j }, [j, el("td", { class: "tokcell" }, label(j)), num("dot", n.dot[j]),
        num("scaled", n.s[j]), num("exp", n.e[j]), num("alpha", n.alpha[j], 6), bar,
        num("contrib", n.alpha[j] * vnorm(L, h, j)),
        el("td", { class: "vec" }, vec(n.v.subarray(j * DK, (j + 1) * DK), 3))]));
    }
    const future = (first, last) => tb.append(row({ class: "future" }, [first === last ? first : `${first}…${last}`,
      el("td", { class: "tokcell" }, first === last ? label(first) : `${last - first + 1} keys`),
      "future", "−∞", "0", "0", "", "0", ""]));
    for (let j = i + 1; j <= Math.min(i + 2, W - 1); j++) future(j, j);
    if (i + 3 <= W - 1) future(i + 3, W - 1);
    tb.append(row({ class: "total" }, ["Σ", "", "", "", num("exp", n.sum),
                                      num("alpha", n.alpha.reduce((x, y) => x + y, 0), 6), "", "", ""]));
    body.append(el("table", { id: "step-table" }, [el("thead", {}, [row({}, cols.map((c) => el("th", {}, c)))]), tb]));
    body.append(el("p", { class: "vec", id: "step-output" }, `output_${i} = Σ_j α_j v_j = ${vec(n.out, DK)}`));
    body.append(el("p", { class: "hint" }, "The row sums to 1: the budget each query spends. ‖α_j v_j W_O‖ is what key j " +
      "adds to the residual stream through this head: a large α_j on a short value vector adds little."));
  }

  // ---- start -------------------------------------------------------------------------------------
  let current = null; // the tab shown
  function showTab(name) {
    if (name === "model") drawPendingMaps(Infinity);
    if (name === "head" || name === "text") st.tokenView = name;
    current = name;
    for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
    for (const p of ["head", "text", "model", "stats", "circuit"]) {
      $(`pane-${p}`).classList.toggle("hidden", p !== name);
    }
    // room for the table's columns, and for the circuit's graph beside its panel
    document.querySelector("main").classList.toggle("wide", name === "stats" || name === "circuit");
    if (name === "head" || name === "text") revealQuery();
  }
  async function start() {
    if (typeof DecompressionStream === "undefined") throw new Error("this browser lacks DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+)");
    unpack(await gunzip(await bytesOf("attn-data")), M.arrays, A);
    api.marks.decoded = performance.now();
    $("info").textContent = (M.info ? M.info + " · " : "") + `${M.layers.length} of ${M.n_layer} layers × ${H} heads (${M.n_kv_head} kv), ` +
      `d_k ${DK} · ${W === M.n_tokens ? W + " tokens" : `tokens 0–${W - 1} of ${M.n_tokens} (window)`}`;
    for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => showTab(b.dataset.tab));
    const shared = { $, el, M, st, alpha, vnorm, fmt, label, W, H, setLayer, setFocus, pickQuery, openHead: showHead,
                     roleOf, SVG_NS };
    textView = window.attnTextView(shared);
    buildHeadView(); buildStep(); textView.build();
    api.marks.headView = performance.now();
    buildModelView();
    api.marks.modelView = performance.now();
    window.attnStatsView(shared).build();
    if (M.circuit) { // the Circuit tab only where the page was given the circuit (sample.py --dump-attn)
      api.circuitView = window.attnCircuitView(shared);
      api.circuitView.build();
      $("tab-circuit").classList.remove("hidden");
    }
    setLayer(st.layer, M.selected[st.layer]);
    showTab(M.first_view); // the text view first for long or char-level prompts; the last query in sight
    api.ready = true;
    api.readyMs = performance.now();
    document.documentElement.dataset.ready = "1";
    $("status").textContent = `ready in ${Math.round(api.readyMs)} ms`;
    setTimeout(() => drawPendingMaps(30), 0);
    const detail = await bytesOf("attn-detail");
    if (detail) unpack(await gunzip(detail), M.detail_arrays, D);
    api.detailReady = true;
    api.detailMs = performance.now();
    document.documentElement.dataset.detail = "1";
    renderStep();
  }
  start().catch((err) => { $("status").textContent = "error: " + err.message; api.error = String(err); });
})();
