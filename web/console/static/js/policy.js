// Policy: edit the policy's files, validate them (errors shown at their
// line), dry-run them against the running processes, apply them, and roll
// back to an earlier revision. Changes need the API token, pasted once and
// kept in sessionStorage (this tab only).

import { $, h, replace, classChip } from './dom.js';
import { APIError, get, post, list, token, setToken } from './api.js';
import { Editor } from './editor.js';

const detailRE = /^(.+?):(\d+)(?::(\d+))?: (.*)$/;

export class Policy {
  constructor(store) {
    this.store = store;
    this.files = new Map(); // name -> { text, original }
    this.current = '';
    this.diags = [];
    this.loaded = false;
    this.armed = null; // the button waiting for its confirming click
    this.editor = new Editor($('po-editor'), {
      onChange: (text) => { this.files.get(this.current).text = text; this.tabs(); },
      onCursor: (row, col) => { $('po-cursor').textContent = `${this.current}  line ${row}, column ${col}`; },
    });
    $('po-editor').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); this.validate(); }
    });
    $('po-validate').addEventListener('click', () => this.validate());
    $('po-dryrun').addEventListener('click', () => this.dryRun());
    $('po-apply').addEventListener('click', () => this.confirm($('po-apply'), 'Confirm apply', () => this.apply()));
    $('po-revert').addEventListener('click', () => this.revert());
    $('po-token-save').addEventListener('click', () => this.saveToken());
    $('po-token').addEventListener('keydown', (e) => { if (e.key === 'Enter') this.saveToken(); });
    this.tokenState();
  }

  visible(on) {
    if (on && !this.loaded) this.load();
    if (on) this.history();
  }

  // load reads the policy in force. The API gives its file names, and
  // their text where it has it (sources); files it does not give start
  // empty so that the operator can paste them.
  async load() {
    let st = null;
    try {
      st = await get('/policy');
    } catch (e) {
      this.result(h('p', { class: 'bad' }, e.message));
    }
    this.loaded = true;
    this.status = st;
    const sources = (st && (st.sources || st.contents)) || {};
    const names = st ? (Array.isArray(st.files) ? st.files : Object.keys(st.files || {})) : [];
    for (const n of new Set([...names, ...Object.keys(sources)])) {
      const text = sources[n] ?? (st && st.files && !Array.isArray(st.files) ? st.files[n] : undefined);
      this.files.set(n, { text: text ?? '', original: text ?? '', missing: text === undefined });
    }
    if (!this.files.size) this.files.set('policy.rego', { text: '', original: '', missing: false });
    this.current = [...this.files.keys()].find((n) => n.endsWith('.rego') && !n.endsWith('_test.rego')) || [...this.files.keys()][0];
    this.editor.value = this.files.get(this.current).text;
    this.tabs();
    this.showStatus();
    $('po-apply').disabled = !!(st && st.read_only);
    if (st && st.read_only) {
      this.result(h('p', { class: 'muted' }, `Read only: ${st.read_only}. Validate and dry run still check a change.`));
    } else if ([...this.files.values()].some((f) => f.missing)) {
      this.result(h('p', { class: 'muted' }, 'The daemon lists the policy\u2019s files but does not serve their text: paste each file into its tab before validating or applying.'));
    }
  }

  showStatus() {
    const st = this.status;
    if (!st) return;
    const when = st.loaded_at ? new Date(st.loaded_at).toLocaleString([], { hour12: false }) : '';
    $('po-current').textContent = `revision ${String(st.revision || '—').slice(0, 12)}${when ? ` · loaded ${when}` : ''}`;
  }

  tabs() {
    replace($('po-files'), [...this.files.entries()].map(([name, f]) => {
      const errs = this.diags.filter((d) => sameFile(d.file, name)).length;
      return h('button', {
        type: 'button', role: 'tab', 'aria-selected': name === this.current ? 'true' : 'false',
        onclick: () => this.open(name),
      }, name, f.text !== f.original ? h('span', { class: 'mod', title: 'edited' }, ' ●') : null, errs ? h('span', { class: 'bad' }, ` ${errs}`) : null);
    }));
  }

  open(name) {
    this.current = name;
    this.editor.value = this.files.get(name).text;
    this.mark();
    this.tabs();
  }

  revert() {
    for (const f of this.files.values()) f.text = f.original;
    this.editor.value = this.files.get(this.current).text;
    this.diags = [];
    this.mark();
    this.tabs();
    this.result(h('p', { class: 'muted' }, 'Edits discarded.'));
  }

  body() {
    const files = {};
    for (const [name, f] of this.files) files[name] = f.text;
    return { files };
  }

  // mark shows the current file's diagnostics at their lines.
  mark() {
    this.editor.setErrors(this.diags.filter((d) => sameFile(d.file, this.current) || (!d.file && this.files.size === 1)));
  }

  async validate() {
    await this.run($('po-validate'), async () => {
      const r = await post('/policy/validate', this.body());
      this.diags = r.diagnostics || [];
      this.mark();
      this.tabs();
      if (r.valid) this.result(h('p', { class: 'ok' }, '✓ Valid: it loads, checks and passes its tests. Apply it when ready.'));
      else this.showDiagnostics('Not valid', this.diags);
    });
  }

  async dryRun() {
    await this.run($('po-dryrun'), async () => {
      const r = await post('/policy/dry-run', this.body());
      const procs = list(r, 'processes');
      const changed = procs.filter((c) => c.changed);
      this.diags = [];
      this.mark();
      this.tabs();
      this.result(
        h('p', null, h('strong', null, `${changed.length} of ${procs.length} running processes would change.`)),
        changed.length ? h('table', { class: 'changes' },
          h('thead', null, h('tr', null, h('th', null, 'Process'), h('th', null, 'Class'), h('th', null, 'Level'))),
          h('tbody', null, changed.map((c) => h('tr', { title: c.fallback ? `fallback: ${c.fallback}` : c.reason || '' },
            h('td', null, h('span', { class: 'name' }, c.comm || ''), ` ${c.pid}`),
            h('td', null, classChip(c.from_class), h('span', { class: 'arrow' }, ' → '), classChip(c.to_class)),
            h('td', null, `${c.from_level} → ${c.to_level}`))))) : null);
    });
  }

  async apply() {
    await this.run($('po-apply'), async () => {
      const r = await post('/policy/apply', this.body());
      for (const f of this.files.values()) f.original = f.text;
      this.diags = [];
      this.mark();
      this.tabs();
      this.result(h('p', { class: 'ok' }, `✓ Applied: revision ${String(r.revision).slice(0, 12)} is in force.`));
      await this.reloadStatus();
    });
  }

  async rollback(rev, button) {
    await this.run(button, async () => {
      const r = await post('/policy/rollback', { revision: rev });
      this.result(h('p', { class: 'ok' }, `✓ Rolled back: revision ${String(r.revision).slice(0, 12)} is in force.`));
      this.loaded = false;
      this.files.clear();
      await this.load();
      await this.reloadStatus();
    });
  }

  async reloadStatus() {
    try { this.status = await get('/policy'); this.showStatus(); } catch (e) { console.warn('console:', e.message); }
    await this.history();
  }

  async history() {
    let revs;
    try {
      revs = list(await get('/policy/history'), 'revisions');
    } catch (e) {
      replace($('po-history'), h('li', null, h('span', { class: 'muted' }, e.message)));
      return;
    }
    replace($('po-history'), revs.length ? revs.map((r) => {
      const b = r.current ? null : h('button', { type: 'button', class: 'danger', title: `Apply revision ${r.revision} again` }, 'Roll back');
      if (b) b.addEventListener('click', () => this.confirm(b, 'Confirm', () => this.rollback(r.revision, b)));
      return h('li', { class: r.current ? 'current' : '' },
        h('span', { class: 'rev', title: r.revision }, String(r.revision).slice(0, 12), r.current ? h('span', { class: 'ok' }, '  in force') : null),
        b || h('span'),
        h('span', { class: 'when' }, `${r.applied_at ? new Date(r.applied_at).toLocaleString([], { hour12: false }) : ''} · ${r.origin || ''} · ${(r.files || []).length} files`));
    }) : h('li', null, h('span', { class: 'muted' }, 'No revision applied since the daemon started.')));
  }

  // confirm makes a destructive button need a second click within 5 s.
  confirm(button, label, fn) {
    if (this.armed === button) {
      this.disarm();
      fn();
      return;
    }
    this.disarm();
    this.armed = button;
    button.dataset.label = button.textContent;
    button.textContent = label;
    button.classList.add('armed');
    this.armedTimer = setTimeout(() => this.disarm(), 5000);
  }

  disarm() {
    const b = this.armed;
    if (!b) return;
    clearTimeout(this.armedTimer);
    b.textContent = b.dataset.label;
    b.classList.remove('armed');
    this.armed = null;
  }

  // run calls the API with button disabled and shows its failure.
  async run(button, fn) {
    if (!token()) {
      this.result(h('p', { class: 'bad' }, 'Changes need the API token: paste it above (it is kept for this tab only).'));
      $('po-token').focus();
      return;
    }
    button.disabled = true;
    try {
      await fn();
    } catch (e) {
      this.failed(e);
    } finally {
      button.disabled = false;
    }
  }

  failed(e) {
    if (e instanceof APIError && e.status === 401) {
      setToken('');
      this.tokenState();
      this.result(h('p', { class: 'bad' }, 'The daemon refused the token: paste the current one from its token file.'));
      $('po-token').focus();
      return;
    }
    const details = (e instanceof APIError && e.body && e.body.details) || [];
    if (details.length) {
      this.diags = details.map((d) => {
        const m = detailRE.exec(d);
        return m ? { file: m[1], row: Number(m[2]), col: Number(m[3] || 0), message: m[4] } : { message: d };
      });
      this.mark();
      this.tabs();
      this.showDiagnostics((e.body && e.body.error) || e.message, this.diags);
      return;
    }
    this.result(h('p', { class: 'bad' }, (e.body && e.body.error) || e.message));
  }

  showDiagnostics(title, diags) {
    this.result(h('p', { class: 'bad' }, `✗ ${title}`),
      h('ul', { class: 'diag' }, diags.map((d) => h('li', null, h('button', {
        type: 'button', onclick: () => this.jump(d),
      }, h('span', { class: 'where' }, `${d.file || ''}${d.row ? `:${d.row}` : ''}${d.col ? `:${d.col}` : ''}${d.code ? ` ${d.code}` : ''}`), d.message)))));
  }

  jump(d) {
    const name = [...this.files.keys()].find((n) => sameFile(d.file, n));
    if (name && name !== this.current) this.open(name);
    if (d.row) this.editor.goto(d.row, d.col);
  }

  result(...nodes) { replace($('po-result'), nodes); }

  saveToken() {
    const v = $('po-token').value.trim();
    if (!v) return;
    setToken(v);
    $('po-token').value = '';
    this.tokenState();
  }

  tokenState() {
    const set = !!token();
    $('po-token-state').textContent = set ? 'Token set for this tab.' : 'No token: reading works, changes need one.';
    $('po-token').placeholder = set ? 'Paste a new token to replace it' : 'Paste the token once; kept for this tab only';
  }
}

// sameFile: a diagnostic's file may carry the policy directory's path.
function sameFile(diagFile, name) {
  if (!diagFile) return false;
  return diagFile === name || diagFile.endsWith(`/${name}`);
}
