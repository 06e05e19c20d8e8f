// Events: the engine's decisions, newest first — classifications,
// fallbacks, registration settings, escalations, failed enforcement — and,
// on request, the per-request preemptions.

import { $, h, replace, classChip } from './dom.js';
import { clock } from './format.js';

const maxRows = 500;

export class Events {
  constructor(store) {
    this.store = store;
    this.paused = false;
    this.shown = false;
    this.pending = 0;
    this.query = '';
    this.newest = 0;
    $('ev-search').addEventListener('input', (e) => { this.query = e.target.value.trim().toLowerCase(); this.render(); });
    $('ev-preempt').addEventListener('change', () => this.render());
    $('ev-errors').addEventListener('change', () => this.render());
    $('ev-pause').addEventListener('click', () => this.pause());
    store.on('decision', () => this.soon());
    store.on('snapshot', () => this.soon());
  }

  visible(on) {
    this.shown = on;
    if (on) this.render();
  }

  pause() {
    this.paused = !this.paused;
    $('ev-pause').setAttribute('aria-pressed', String(this.paused));
    $('ev-pause').textContent = this.paused ? 'Resume' : 'Pause';
    if (!this.paused) this.render();
  }

  // soon renders at most twice a second however fast decisions come.
  soon() {
    if (!this.shown || this.paused || this.pending) return;
    this.pending = setTimeout(() => { this.pending = 0; this.render(); }, 500);
  }

  render() {
    let all = this.store.decisions;
    if ($('ev-preempt').checked) all = [...all, ...this.store.preemptions];
    let rows = all;
    if ($('ev-errors').checked) rows = rows.filter((d) => d.error);
    if (this.query) {
      const q = this.query;
      rows = rows.filter((d) => [d.pid, d.comm, d.class, d.action, d.reason, d.error, d.level]
        .some((v) => v !== undefined && v !== null && String(v).toLowerCase().includes(q)));
    }
    rows = [...rows].sort((a, b) => b.time - a.time).slice(0, maxRows);
    const prevNewest = this.newest;
    this.newest = rows.length ? rows[0].time : 0;
    replace($('ev-table').querySelector('tbody'), rows.map((d) => h('tr', { class: `${d.error ? 'err' : ''} ${prevNewest && d.time > prevNewest ? 'fresh' : ''}` },
      h('td', { class: 'mono', title: `engine time ${d.time} ns` }, stamp(this.store.wallOf(d.time))),
      h('td', null, h('span', { class: `chip action-${d.action}` }, d.action)),
      h('td', { class: 'num' }, d.pid ? String(d.pid) : '—'),
      h('td', { class: 'name' }, d.comm || ''),
      h('td', null, d.class ? classChip(d.class) : ''),
      h('td', { class: 'num' }, d.gpu >= 0 ? String(d.gpu) : '—'),
      h('td', null, d.level || ''),
      h('td', { class: 'reason' }, d.reason || '', d.error ? h('div', { class: 'bad' }, `failed: ${d.error}`) : null))));
    $('ev-empty').hidden = rows.length > 0;
    $('ev-count').textContent = `${rows.length} shown of ${all.length} kept` + (this.store.snapshot?.status?.decisions_total ? ` · ${this.store.snapshot.status.decisions_total} ever` : '');
  }
}

// stamp is a wall-clock time to the millisecond.
function stamp(d) { return `${clock(d)}.${String(d.getMilliseconds()).padStart(3, '0')}`; }
