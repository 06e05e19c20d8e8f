// A small Rego editor: a plain textarea over a highlighted copy of its
// text, with line numbers and error lines. No library: the editor
// libraries inject their styles at run time, which the console's CSP
// (style-src 'self', no nonce) refuses. Highlighting builds spans with
// textContent only.

import { h } from './dom.js';

const keywords = new Set(['package', 'import', 'default', 'not', 'some', 'every', 'in', 'if', 'contains', 'else', 'as', 'with', 'future', 'rego']);
const constants = new Set(['true', 'false', 'null', 'input', 'data']);
// One regular expression with a group per token kind, tried in order.
const tokenRE = /(#.*)|("(?:[^"\\\n]|\\.)*"?|`[^`]*`?)|(\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)|(:=|==|!=|<=|>=|=|<|>|\||&|\+|-|\*|\/|%)/g;

export class Editor {
  constructor(host, { onChange, onCursor } = {}) {
    this.onChange = onChange || (() => {});
    this.onCursor = onCursor || (() => {});
    this.errors = new Map(); // row -> message
    this.gutter = h('div', { class: 'gutter', 'aria-hidden': 'true' });
    this.pre = h('pre', { 'aria-hidden': 'true' });
    this.area = h('textarea', {
      spellcheck: 'false', autocapitalize: 'off', autocomplete: 'off', wrap: 'off',
      'aria-label': 'Policy source (Tab indents; Esc then Tab leaves the editor)',
    });
    host.append(this.gutter, h('div', { class: 'code' }, this.pre, this.area));
    this.escaped = false;
    this.area.addEventListener('input', () => { this.paint(); this.onChange(this.area.value); });
    this.area.addEventListener('keydown', (e) => this.key(e));
    for (const ev of ['keyup', 'click', 'select', 'focus']) this.area.addEventListener(ev, () => this.cursor());
  }

  get value() { return this.area.value; }
  set value(v) {
    this.area.value = v;
    this.paint();
    this.cursor();
  }

  // setErrors marks the given rows (1-based) with their messages.
  setErrors(list) {
    this.errors = new Map();
    for (const e of list) if (e.row > 0) this.errors.set(e.row, this.errors.has(e.row) ? `${this.errors.get(e.row)}\n${e.message}` : e.message);
    this.paint();
  }

  // goto puts the caret at row:col (1-based) and scrolls it into view.
  goto(row, col) {
    const lines = this.area.value.split('\n');
    let at = 0;
    for (let i = 0; i < Math.min(row - 1, lines.length); i++) at += lines[i].length + 1;
    at += Math.max(0, Math.min((col || 1) - 1, (lines[row - 1] || '').length));
    this.area.focus();
    this.area.setSelectionRange(at, at);
    const line = this.gutter.children[row - 1];
    line?.scrollIntoView({ block: 'center' });
    this.cursor();
  }

  key(e) {
    if (e.key === 'Escape') { this.escaped = true; return; }
    if (e.key === 'Tab' && !this.escaped && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey) {
      e.preventDefault();
      const { selectionStart: a, selectionEnd: b, value } = this.area;
      this.area.value = value.slice(0, a) + '\t' + value.slice(b);
      this.area.setSelectionRange(a + 1, a + 1);
      this.paint();
      this.onChange(this.area.value);
    }
    this.escaped = false;
  }

  cursor() {
    const v = this.area.value.slice(0, this.area.selectionStart);
    const row = v.split('\n').length;
    const col = v.length - v.lastIndexOf('\n');
    this.row = row;
    this.onCursor(row, col);
    for (const d of this.gutter.querySelectorAll('.current')) d.classList.remove('current');
    this.gutter.children[row - 1]?.classList.add('current');
  }

  // paint re-highlights everything: policies are small, and one pass keeps
  // strings and comments that span edits right.
  paint() {
    const lines = this.area.value.split('\n');
    const frag = document.createDocumentFragment();
    const gut = document.createDocumentFragment();
    lines.forEach((line, i) => {
      const row = i + 1;
      const err = this.errors.get(row);
      const span = h('span', { class: err ? 'line-error' : null });
      highlight(line, span);
      frag.append(span, '\n');
      gut.append(h('div', { class: err ? 'error' : null, title: err || null }, String(row)));
    });
    this.pre.replaceChildren(frag);
    this.gutter.replaceChildren(gut);
    if (this.row) this.gutter.children[this.row - 1]?.classList.add('current');
  }
}

// highlight appends line's tokens to el as text nodes and spans.
export function highlight(line, el) {
  let last = 0;
  tokenRE.lastIndex = 0;
  for (let m; (m = tokenRE.exec(line));) {
    if (m.index > last) el.append(line.slice(last, m.index));
    const [text, com, str, num, ident, op] = m;
    let cls = null;
    if (com) cls = 'tok-com';
    else if (str) cls = 'tok-str';
    else if (num) cls = 'tok-num';
    else if (ident) {
      if (keywords.has(ident)) cls = 'tok-kw';
      else if (constants.has(ident.split('.')[0])) cls = 'tok-var';
      else if (line[m.index + text.length] === '(') cls = 'tok-bi';
    } else if (op) cls = 'tok-op';
    if (cls) el.append(h('span', { class: cls }, text));
    else el.append(text);
    last = m.index + text.length;
  }
  if (last < line.length) el.append(line.slice(last));
}
