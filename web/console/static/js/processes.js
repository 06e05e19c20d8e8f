// Processes: every CUDA process the engine knows, searchable and sortable,
// with a detail view of every field the API gives — including why a
// process is not managed or is enforced at a weaker level than planned.

import { $, h, replace, classChip } from './dom.js';
import { count, dur, pct } from './format.js';
import { get } from './api.js';

const columns = [
  { key: 'pid', label: 'PID', num: true, value: (p) => p.pid },
  { key: 'comm', label: 'Name', value: (p) => p.comm || '', cell: (p) => h('span', { class: 'name' }, p.comm || '—') },
  { key: 'class', label: 'Class', value: (p) => p.class, cell: (p) => classChip(p.class) },
  { key: 'level', label: 'Enforcement', value: (p) => p.level, cell: levelCell },
  { key: 'state', label: 'State', value: (p) => p.state, cell: (p) => h('span', { class: `state ${p.state}` }, p.state) },
  { key: 'gpus', label: 'GPUs', value: (p) => (p.gpus || []).join(','), cell: (p) => (p.gpus || []).join(', ') || '—' },
  { key: 'launches', label: 'Launches', num: true, value: (p) => p.launches, cell: (p) => count(p.launches) },
  { key: 'requests', label: 'Requests', num: true, value: (p) => p.latency?.requests ?? 0, cell: (p) => p.latency_critical ? count(p.latency?.requests) : '—' },
  { key: 'p99', label: 'p99', num: true, value: (p) => p.latency?.p99_ns ?? 0, cell: (p) => p.latency_critical ? dur(p.latency?.p99_ns) : '—' },
  { key: 'slo', label: 'SLO', num: true, value: (p) => p.latency?.has_slo ? p.latency.attainment : -2, cell: sloCell },
];

export class Processes {
  constructor(store) {
    this.store = store;
    this.sort = { key: 'pid', dir: 1 };
    this.query = '';
    this.selected = null; // pid in the detail view
    this.cursor = null;   // pid of the row with the roving tabindex
    this.detailDoc = null;
    this.head();
    $('pr-search').addEventListener('input', (e) => { this.query = e.target.value.trim().toLowerCase(); this.render(); });
    $('pr-limited').addEventListener('change', () => this.render());
    $('pr-detail-close').addEventListener('click', () => this.close());
    $('pr-table').querySelector('tbody').addEventListener('keydown', (e) => this.key(e));
    store.on('snapshot', () => this.render());
  }

  head() {
    const tr = $('pr-table').querySelector('thead tr');
    replace(tr, columns.map((c) => h('th', { scope: 'col', class: c.num ? 'num' : '', dataset: { key: c.key } },
      h('button', { type: 'button', onclick: () => this.sortBy(c.key), title: `Sort by ${c.label.toLowerCase()}` }, c.label))));
    this.markSort();
  }

  sortBy(key) {
    this.sort = { key, dir: this.sort.key === key ? -this.sort.dir : (columns.find((c) => c.key === key).num ? -1 : 1) };
    this.markSort();
    this.render();
  }

  markSort() {
    for (const th of $('pr-table').querySelectorAll('th')) {
      if (th.dataset.key === this.sort.key) th.setAttribute('aria-sort', this.sort.dir > 0 ? 'ascending' : 'descending');
      else th.removeAttribute('aria-sort');
    }
  }

  rows() {
    const s = this.store.snapshot;
    if (!s) return [];
    let rows = s.processes;
    if ($('pr-limited').checked) rows = rows.filter((p) => p.limit);
    if (this.query) {
      const q = this.query;
      rows = rows.filter((p) => [p.pid, p.comm, p.class, p.reason, p.fallback, p.limit, p.unmanaged_reason, p.state, p.level]
        .some((v) => v !== undefined && v !== null && String(v).toLowerCase().includes(q)));
    }
    const col = columns.find((c) => c.key === this.sort.key);
    const dir = this.sort.dir;
    return [...rows].sort((a, b) => {
      const x = col.value(a), y = col.value(b);
      const c = typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y));
      return dir * c || a.pid - b.pid;
    });
  }

  render() {
    const s = this.store.snapshot;
    const tbody = $('pr-table').querySelector('tbody');
    const hadFocus = tbody.contains(document.activeElement);
    const rows = this.rows();
    if (this.cursor === null || !rows.some((p) => p.pid === this.cursor)) this.cursor = rows.length ? rows[0].pid : null;
    replace(tbody, rows.map((p) => {
      const tr = h('tr', {
        dataset: { pid: String(p.pid) },
        tabindex: p.pid === this.cursor ? '0' : '-1',
        'aria-selected': p.pid === this.selected ? 'true' : 'false',
        onclick: () => this.open(p.pid),
        onfocus: () => { this.cursor = p.pid; },
      }, columns.map((c) => h('td', { class: c.num ? 'num' : '' }, c.cell ? c.cell(p) : String(c.value(p)))));
      return tr;
    }));
    if (hadFocus && this.cursor !== null) tbody.querySelector(`tr[data-pid="${this.cursor}"]`)?.focus();
    $('pr-empty').hidden = rows.length > 0;
    $('pr-empty').textContent = s && s.processes.length ? 'No process matches.' : 'No CUDA process seen yet.';
    $('pr-count').textContent = s ? `${rows.length} of ${s.processes.length}` : '';
    if (this.selected !== null) this.detail();
  }

  key(e) {
    const trs = [...$('pr-table').querySelectorAll('tbody tr')];
    const i = trs.indexOf(document.activeElement);
    if (i < 0) return;
    let next = null;
    if (e.key === 'ArrowDown') next = trs[Math.min(trs.length - 1, i + 1)];
    else if (e.key === 'ArrowUp') next = trs[Math.max(0, i - 1)];
    else if (e.key === 'Home') next = trs[0];
    else if (e.key === 'End') next = trs[trs.length - 1];
    else if (e.key === 'Enter' || e.key === ' ') { this.open(Number(trs[i].dataset.pid)); e.preventDefault(); return; }
    if (!next) return;
    e.preventDefault();
    trs[i].tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
  }

  async open(pid) {
    this.selected = pid;
    this.cursor = pid;
    this.detailDoc = null;
    $('pr-detail').hidden = false;
    $('pr-detail').parentElement.classList.add('open');
    for (const tr of $('pr-table').querySelectorAll('tbody tr')) tr.setAttribute('aria-selected', tr.dataset.pid === String(pid) ? 'true' : 'false');
    this.detail();
    try {
      // The single-process endpoint may say more than the snapshot (its
      // command line, labels): show whatever it gives.
      const doc = await get(`/processes/${pid}`);
      if (this.selected === pid) { this.detailDoc = doc && (doc.process || doc); this.detail(); }
    } catch (e) {
      if (e.status !== 404) console.warn('console:', e.message);
    }
  }

  close() {
    const pid = this.selected;
    this.selected = null;
    $('pr-detail').hidden = true;
    $('pr-detail').parentElement.classList.remove('open');
    for (const tr of $('pr-table').querySelectorAll('tbody tr[aria-selected="true"]')) tr.setAttribute('aria-selected', 'false');
    $('pr-table').querySelector(`tbody tr[data-pid="${pid}"]`)?.focus();
  }

  escape() { if (this.selected !== null) this.close(); }

  detail() {
    const live = this.store.snapshot?.processes.find((p) => p.pid === this.selected);
    const p = { ...(this.detailDoc || {}), ...(live || {}) };
    if (!live && !this.detailDoc) {
      $('pr-detail-title').textContent = `pid ${this.selected}`;
      replace($('pr-detail-body'), h('dd', null, 'This process has left the table (it exited).'));
      return;
    }
    $('pr-detail-title').textContent = `${p.comm || '?'} · ${p.pid}`;
    const l = p.latency || {};
    const t = (ns) => ns ? `${this.store.wallOf(ns).toLocaleTimeString([], { hour12: false })}` : '—';
    const row = (k, v, cls) => [h('dt', null, k), h('dd', { class: cls || '' }, v === undefined || v === null || v === '' ? '—' : v)];
    const items = [
      h('dt', { class: 'section' }, 'Management'),
      row('Status', managed(p), p.level === 'observe' || p.limit || p.fallback ? 'note' : ''),
      row('Class', classChip(p.class)),
      row('Priority', String(p.priority ?? '—')),
      row('Policy reason', p.reason),
      p.fallback ? row('Fallback', p.fallback, 'note') : null,
      row('Planned level', p.planned),
      row('Applied level', p.level, p.limit ? 'lvl-weak' : ''),
      p.limit ? row('Why weaker', p.limit, 'note') : null,
      row('State', h('span', { class: `state ${p.state}` }, p.state)),
      row('GPUs', (p.gpus || []).join(', ')),
      row('Latency-critical', p.latency_critical ? 'yes' : 'no'),
      h('dt', { class: 'section' }, 'Activity'),
      row('Launches', count(p.launches)),
      p.launch_rate !== undefined ? row('Launch rate', `${p.launch_rate.toFixed(1)}/s`) : null,
      p.copies !== undefined ? row('Copies', count(p.copies)) : null,
      p.syncs !== undefined ? row('Syncs', count(p.syncs)) : null,
      p.first_seen !== undefined ? row('First seen', t(p.first_seen)) : null,
      p.last_seen !== undefined ? row('Last seen', t(p.last_seen)) : null,
    ];
    if (p.latency_critical || l.requests) {
      items.push(h('dt', { class: 'section' }, 'Requests'),
        row('Requests', count(l.requests)),
        row('In flight', l.active ? 'yes' : 'no'),
        row('p50 / p99 / max', `${dur(l.p50_ns)} / ${dur(l.p99_ns)} / ${dur(l.max_ns)}`));
      if (l.has_slo) {
        items.push(row('SLO', `p${l.percentile} ≤ ${dur(l.target_ns)} over ${dur(l.window_ns)}`),
          row('Attainment', `${pct(l.attainment)} of ${count(l.window_requests)} requests`, l.attainment >= 0 && l.attainment < l.percentile / 100 ? 'bad' : ''));
      }
    }
    const known = new Set(['pid', 'comm', 'class', 'priority', 'reason', 'fallback', 'planned', 'level', 'limit', 'state', 'gpus',
      'latency_critical', 'launches', 'launch_rate', 'copies', 'syncs', 'first_seen', 'last_seen', 'latency',
      'unmanaged', 'unmanaged_reason', 'requests', 'p50_seconds', 'p99_seconds', 'slo_attainment']);
    const extra = Object.keys(p).filter((k) => !known.has(k)).sort();
    if (extra.length) {
      items.push(h('dt', { class: 'section' }, 'More'));
      for (const k of extra) items.push(row(k.replace(/_/g, ' '), show(p[k]), 'mono'));
    }
    replace($('pr-detail-body'), items);
  }
}

// managed says in words whether and how the engine manages p.
function managed(p) {
  if (p.level === 'observe') {
    if (p.unmanaged_reason) return `Not managed: ${p.unmanaged_reason}`;
    if (p.limit) return `Not managed: ${p.limit}`;
    return `Not managed: its policy asks only to observe it${p.reason ? ` (${p.reason})` : ''}.`;
  }
  if (p.limit) return `Managed at ${p.level}, weaker than the planned ${p.planned}: ${p.limit}`;
  if (p.fallback) return `Managed at ${p.level} under the policy's default decision.`;
  return `Managed at ${p.level}, as planned.`;
}

function levelCell(p) {
  if (p.limit) return h('span', { class: 'lvl-weak', title: `planned ${p.planned}: ${p.limit}` }, `${p.level} ⚠`);
  if (p.level === 'observe') return h('span', { class: 'muted' }, 'observe');
  return p.level;
}

function sloCell(p) {
  const l = p.latency;
  if (!l || !l.has_slo) return '—';
  if (l.attainment < 0) return h('span', { class: 'muted' }, 'no data');
  return h('span', { class: l.attainment < l.percentile / 100 ? 'bad' : 'ok' }, pct(l.attainment));
}

// show renders any JSON value as text.
function show(v) {
  if (v === null || v === undefined) return '—';
  if (Array.isArray(v)) return v.map((x) => (typeof x === 'object' ? JSON.stringify(x) : String(x))).join(' ');
  if (typeof v === 'object') return Object.entries(v).map(([k, x]) => `${k}=${typeof x === 'object' ? JSON.stringify(x) : x}`).join('\n');
  return String(v);
}
