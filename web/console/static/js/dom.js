// DOM building. Every string becomes a text node: nothing the console shows
// is ever parsed as HTML, so a process named "<img onerror=…>" stays text.

// h makes an element. attrs: class, dataset (object), on<event> handlers,
// boolean and string attributes. Children: nodes, strings (as text),
// numbers, arrays, null/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// replace empties el and appends children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// $ finds one element by id; a missing one is a bug in index.html.
export function $(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`console: no element #${id} in index.html`);
  return el;
}

// classColor gives a class name a stable colour index (chip classes c0..c5);
// the built-in classes keep fixed colours.
const fixed = { 'latency-critical': 0, 'best-effort': 1 };
export function classColor(name) {
  if (name in fixed) return fixed[name];
  let x = 0;
  for (const ch of String(name)) x = (x * 31 + ch.codePointAt(0)) >>> 0;
  return 2 + (x % 4);
}

export const palette = ['#ffb454', '#79c0ff', '#7ee787', '#d2a8ff', '#ff9bce', '#a5d6ff'];

export function classChip(name) {
  return h('span', { class: `chip c${classColor(name)}` }, name || '—');
}
