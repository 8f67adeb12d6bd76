// attngpt attention explorer, the text view: the prompt as running, wrapping text, for prompts too long
// (or too char-by-char) for the head view's two columns. Pointing at a token (hover; a click pins it;
// ←/→ and ↑/↓ move the pinned one) shades every earlier token by the weight α_ij that the pointed query i
// gives it in one head, or by its value-weighted norm ‖α_ij v_j W_O^h‖ relative to the row's largest,
// and lists the largest the way one reads them: "it" → "animal" 0.65, "street" 0.20, …, others 0.05.
// explorer.js builds it with window.attnTextView(shared helpers) once the data is decoded.
window.attnTextView = function (x) {
  "use strict";
  const { $, el, M, st, alpha, vnorm, fmt, label, W, H } = x;
  const SHADE = "230, 85, 13"; // RGB of the shading; its opacity is the weight
  const TOP = 5; // weights listed by name; the rest add up to "others"
  const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/;
  let hover = null; // the token under the pointer, if any: it is shown instead of the pinned query

  // A token as running text: its own characters (spaces too), a newline as ↵ and a line break; one with
  // other control characters, or none at all, as its label (\x00, ∅).
  const shown = (j) => (M.texts[j] === "" || CONTROL.test(M.texts[j]) ? label(j) : M.texts[j].replace(/\n/g, "↵\n"));
  const quoted = (j) => `"${M.texts[j].trim() && !CONTROL.test(M.texts[j]) ? M.texts[j].trim() : label(j)}"`;
  // In a char-level prompt one letter says little ("e" of which word?): the word it is in, or for a space
  // or newline the word it comes before, e.g. "␣" (before it), "s" (in because)
  const isSpace = (j) => /^\s+$/.test(M.texts[j]);
  function context(j) {
    if (!M.char_level) return "";
    let a = j, b = j;
    if (isSpace(j)) {
      a = b = j + 1;
      while (b < W && !isSpace(b)) b++;
      return a < b ? ` (before ${M.texts.slice(a, Math.min(b, a + 12)).join("")})` : "";
    }
    while (a > 0 && !isSpace(a - 1)) a--;
    while (b + 1 < W && !isSpace(b + 1)) b++;
    return b > a ? ` (in ${M.texts.slice(Math.max(a, j - 11), Math.min(b + 1, j + 12)).join("")})` : "";
  }

  function build() {
    const ls = $("text-layer"), hs = $("text-head"), body = $("text-body");
    for (const L of M.layers) ls.append(el("option", { value: L }, "layer " + L));
    for (let h = 0; h < H; h++) hs.append(el("option", { value: h }, "head " + h + x.roleOf(M.layers[0], h)));
    ls.addEventListener("change", () => x.setLayer(+ls.value, M.selected[ls.value], st.focus));
    hs.addEventListener("change", () => x.setFocus(+hs.value));
    $("text-vw").addEventListener("change", (e) => { st.textVw = e.target.checked; render(); });
    for (let j = 0; j < W; j++) {
      const t = el("span", { class: "ttok", id: `t-tok-${j}`, "data-index": j, title: `${j}: ${label(j)}` }, shown(j));
      t.addEventListener("mouseenter", () => { hover = j; render(); });
      t.addEventListener("click", () => { hover = null; x.pickQuery(j); });
      body.append(t);
    }
    body.addEventListener("mouseleave", () => { hover = null; render(); });
  }

  // The shading and the list for query i (the pointed token, else the pinned query) of head st.focus.
  function render() {
    const L = st.layer, h = st.focus, i = hover !== null ? hover : st.query;
    $("text-layer").value = L;
    Array.from($("text-head").options).forEach((o, n) => { o.textContent = "head " + n + x.roleOf(L, n); });
    $("text-head").value = h;
    const alphas = Float64Array.from({ length: i + 1 }, (_, j) => alpha(L, h, i, j));
    const values = st.textVw ? alphas.map((a, j) => a * vnorm(L, h, j)) : alphas;
    const top = st.textVw ? Math.max(1e-30, ...values) : 1;
    for (let j = 0; j < W; j++) {
      const t = $(`t-tok-${j}`);
      t.classList.remove("hl"); // the list it was marked from is redrawn below
      t.classList.toggle("q", j === i);
      t.classList.toggle("pinned", j === st.query);
      t.classList.toggle("after", j > i);
      if (j <= i) {
        const shade = values[j] / top;
        t.style.backgroundColor = `rgba(${SHADE}, ${shade})`;
        Object.assign(t.dataset, { alpha: alphas[j], weight: values[j], shade });
      } else {
        t.style.backgroundColor = "";
        delete t.dataset.alpha; delete t.dataset.weight; delete t.dataset.shade;
      }
    }
    const order = Array.from({ length: i + 1 }, (_, j) => j).sort((a, b) => values[b] - values[a] || a - b);
    const list = $("text-top");
    list.replaceChildren(el("span", { class: "from" }, `${quoted(i)}${context(i)} → `));
    order.slice(0, TOP).forEach((j, n) => {
      if (n) list.append(", ");
      const item = el("span", { class: "top-item", "data-key": j, "data-value": values[j], title: `key ${j}` },
        [el("b", {}, quoted(j)), el("span", { class: "ctx" }, context(j)), " " + fmt(values[j], st.textVw ? 3 : 2)]);
      item.addEventListener("mouseenter", () => $(`t-tok-${j}`).classList.add("hl")); // which "e" of several
      item.addEventListener("mouseleave", () => $(`t-tok-${j}`).classList.remove("hl"));
      list.append(item);
    });
    if (order.length > TOP) {
      const rest = order.slice(TOP).reduce((sum, j) => sum + values[j], 0);
      list.append(", ", el("span", { class: "others", "data-value": rest }, `others ${fmt(rest, st.textVw ? 3 : 2)}`));
    }
    $("text-hint").textContent = `Layer ${L}, head ${h}: query ${i} «${label(i)}»` +
      (hover !== null && hover !== st.query ? ` (pointed; pinned: ${st.query})` : " (pinned)") + ". Shade = " +
      (st.textVw ? `‖α_ij · v_j W_O^h‖ / ${fmt(top)}, the row's largest: what each token adds to the output.`
                 : "α_ij, the weight query i gives token j (8-bit); later tokens are grey.") +
      " Point at a token; click to pin it; ←/→ move it.";
  }

  // Scroll the pinned query into sight (the text view of 256 tokens can be taller than the pane).
  function reveal() {
    const t = $(`t-tok-${st.query}`), box = $("text-body");
    if (!t || box.offsetParent === null) return;
    const top = t.offsetTop, bottom = top + t.offsetHeight; // #text-body is the offset parent
    if (top < box.scrollTop) box.scrollTop = top;
    else if (bottom > box.scrollTop + box.clientHeight) box.scrollTop = bottom - box.clientHeight;
  }

  return { build, render, reveal };
};
