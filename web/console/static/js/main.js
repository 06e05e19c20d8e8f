// The console's entry point: wires the store, the event stream and the
// pages, routes between pages by the URL's hash, and owns the header (data
// freshness, the stream-lost banner) and the keyboard shortcuts.

import { $ } from './dom.js';
import { Store, Stream, get, list } from './api.js';
import { ago, clock } from './format.js';
import { Overview } from './overview.js';
import { Charts } from './charts.js';
import { Processes } from './processes.js';
import { Policy } from './policy.js';
import { Events } from './events.js';

const pages = ['overview', 'charts', 'processes', 'policy', 'events'];

class Console {
  constructor() {
    this.store = new Store();
    this.stream = new Stream(this.store);
    this.views = {
      overview: new Overview(this.store),
      charts: new Charts(this.store),
      processes: new Processes(this.store),
      policy: new Policy(this.store),
      events: new Events(this.store),
    };
    this.page = '';
    this.streamUp = false;
    this.lost = null;
  }

  start() {
    window.addEventListener('hashchange', () => this.route());
    document.addEventListener('keydown', (e) => this.key(e));
    $('help-open').addEventListener('click', () => $('help').showModal());
    $('stream-retry').addEventListener('click', () => this.stream.now());
    this.store.on('stream', (s) => this.streamChanged(s));
    this.store.on('snapshot', (s) => {
      const node = s.status && s.status.node && s.status.node.hostname;
      $('node').textContent = node || '';
      this.freshness();
    });
    setInterval(() => { this.freshness(); this.banner(); }, 1000);
    this.route();
    this.load();
    this.stream.open();
  }

  // load reads everything once, so that the pages fill before the
  // stream's first event, and again whenever the stream comes back.
  async load() {
    try {
      await this.store.refresh();
    } catch (e) {
      console.warn('console: load:', e.message);
    }
  }

  // route shows the page the hash names; #/processes/PID also opens that
  // process's detail, so that a link can point at one process.
  route() {
    const parts = location.hash.replace(/^#\/?/, '').split('/');
    let page = parts[0];
    if (!pages.includes(page)) page = 'overview';
    if (page !== this.page) {
      this.page = page;
      for (const p of pages) $(`page-${p}`).hidden = p !== page;
      for (const a of document.querySelectorAll('nav a')) {
        if (a.dataset.page === page) a.setAttribute('aria-current', 'page');
        else a.removeAttribute('aria-current');
      }
      document.title = `${page[0].toUpperCase()}${page.slice(1)} · Arbiter`;
      for (const [name, v] of Object.entries(this.views)) v.visible?.(name === page);
    }
    if (page === 'processes' && /^[1-9][0-9]{0,9}$/.test(parts[1] || '')) this.views.processes.open(Number(parts[1]));
  }

  key(e) {
    const t = e.target;
    const typing = t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || t.isContentEditable;
    if (e.key === 'Escape') {
      this.views[this.page].escape?.();
      return;
    }
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key >= '1' && e.key <= String(pages.length)) {
      location.hash = `#/${pages[Number(e.key) - 1]}`;
      e.preventDefault();
    } else if (e.key === '/') {
      const search = this.page === 'events' ? $('ev-search') : $('pr-search');
      if (this.page !== 'events') location.hash = '#/processes';
      search.focus();
      search.select();
      e.preventDefault();
    } else if (e.key === '?') {
      $('help').showModal();
      e.preventDefault();
    }
  }

  // freshness shows when the data on screen was taken, and goes amber when
  // no snapshot came for three times the stream's usual interval.
  freshness() {
    const s = this.store.snapshot;
    const dot = $('live-dot');
    const box = $('freshness');
    if (!s) return;
    const age = Date.now() - this.store.wall;
    const stale = age > 5000;
    $('data-time').textContent = `data at ${clock(new Date(this.store.wall))}` + (stale ? ` · ${ago(age)}` : '');
    box.classList.toggle('stale', stale);
    dot.className = 'dot ' + (!this.streamUp && this.lost ? 'lost' : stale ? 'stale' : 'live');
    box.title = `engine clock ${(s.time / 1e9).toFixed(3)} s; ${s.stats.events ?? 0} events applied`;
  }

  streamChanged(s) {
    this.streamUp = s.up;
    if (s.up) {
      if (this.lost) this.load(); // catch up on what the stream missed
      this.lost = null;
    } else {
      this.lost ??= Date.now();
      this.retry = s;
    }
    this.banner();
    this.freshness();
  }

  banner() {
    const b = $('stream-banner');
    if (this.streamUp || !this.lost) {
      b.hidden = true;
      return;
    }
    b.hidden = false;
    const wait = Math.max(0, Math.ceil((this.retry.retryAt - Date.now()) / 1000));
    const since = this.store.snapshot ? ` The data shown is from ${clock(new Date(this.store.wall))}.` : '';
    $('stream-banner-text').textContent =
      `No connection to the daemon since ${clock(new Date(this.lost))}.${since} ` +
      (wait > 0 ? `Reconnecting in ${wait}s (attempt ${this.retry.attempt}).` : 'Reconnecting…');
  }
}

new Console().start();
