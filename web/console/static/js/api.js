// The console's only link to the daemon: the REST API under /api/v1 and
// its Server-Sent Events stream. Pages subscribe to the store; nothing else
// fetches.

const base = '/api/v1';
const tokenKey = 'arbiter.token';

// APIError is a failed call: status, the server's message and, for a
// rejected policy, its diagnostics.
export class APIError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function token() { return sessionStorage.getItem(tokenKey) || ''; }
export function setToken(t) {
  if (t) sessionStorage.setItem(tokenKey, t);
  else sessionStorage.removeItem(tokenKey);
}

// get fetches a JSON document.
export async function get(path) {
  return call('GET', path);
}

// post sends a JSON body with the API token.
export async function post(path, body) {
  return call('POST', path, body);
}

async function call(method, path, body) {
  const headers = { Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store' };
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    const t = token();
    if (t) headers.Authorization = `Bearer ${t}`;
    init.body = JSON.stringify(body ?? {});
  }
  let res;
  try {
    res = await fetch(base + path, init);
  } catch (e) {
    throw new APIError(0, `cannot reach the daemon (${method} ${base}${path}): ${e.message}`, null);
  }
  const text = await res.text();
  let doc = null;
  if (text) {
    try { doc = JSON.parse(text); } catch { doc = null; }
  }
  if (!res.ok) {
    const msg = (doc && (doc.message || doc.error)) || text.trim() || res.statusText;
    throw new APIError(res.status, `${method} ${base}${path}: ${res.status} ${msg}`, doc);
  }
  return doc;
}

// list takes a list from a response that is either the list itself or an
// object holding it under one of the keys.
export function list(doc, ...keys) {
  if (Array.isArray(doc)) return doc;
  for (const k of keys) if (doc && Array.isArray(doc[k])) return doc[k];
  return [];
}

// Store keeps the latest view of the engine and the decision log, and
// tells subscribers. Its snapshot is { time, processes, classes, gpus,
// stats, status }: the stream's snapshot events carry the status and the
// processes; classes and GPUs come from their endpoints at each event.
// wall is the browser's clock when the snapshot arrived: the engine's
// clock (time) is monotonic, so wall-clock times of engine events are
// wall - (time - event.time).
export class Store {
  constructor() {
    this.snapshot = null;
    this.wall = 0;
    this.status = null;
    this.decisions = [];
    this.preemptions = [];
    this.subs = { snapshot: [], decision: [], stream: [] };
    this.seen = new Set();
    this.seq = 0;
  }

  on(kind, fn) { this.subs[kind].push(fn); }
  emit(kind, ...args) {
    for (const fn of this.subs[kind]) {
      try { fn(...args); } catch (e) { console.error(`console: ${kind} subscriber failed:`, e); }
    }
  }

  // wallOf converts an engine timestamp to a browser Date.
  wallOf(t) {
    if (!this.snapshot) return new Date();
    return new Date(this.wall - (this.snapshot.time - t) / 1e6);
  }

  // refresh reads everything from the REST API (the first load, and after
  // the stream comes back).
  async refresh() {
    const seq = ++this.seq;
    const [status, procs, decisions, preemptions] = await Promise.all(
      ['/status', '/processes', '/decisions', '/preemptions'].map((p) => get(p)));
    for (const d of list(decisions, 'decisions')) this.addDecision(d, false);
    this.mergePreemptions(list(preemptions, 'preemptions'));
    if (seq !== this.seq) {
      this.emit('decision', null); // the stream's snapshot is newer; the log is not
      return;
    }
    await this.update(status, list(procs, 'processes'), seq);
  }

  // streamed takes a snapshot event's data.
  streamed(ev) {
    if (!ev || !ev.status || !Array.isArray(ev.processes)) throw new Error('snapshot event without status and processes');
    return this.update(ev.status, ev.processes, ++this.seq);
  }

  async update(status, processes, seq) {
    let classes = this.snapshot ? this.snapshot.classes : [];
    let gpus = this.snapshot ? this.snapshot.gpus : [];
    try {
      const [c, g] = await Promise.all([get('/classes'), get('/gpus')]);
      classes = list(c, 'classes');
      gpus = list(g, 'gpus');
    } catch (e) {
      console.warn('console:', e.message);
    }
    if (seq !== this.seq) return; // a newer snapshot is on its way
    this.status = status;
    this.snapshot = { time: status.engine_time ?? 0, processes, classes, gpus, stats: status.engine || {}, status };
    this.wall = Date.now();
    this.emit('snapshot', this.snapshot);
  }

  // addDecision keeps one copy of each decision (the REST list and the
  // stream may both carry it), newest last, at most 2000.
  addDecision(d, live) {
    const key = `${d.time}|${d.pid}|${d.action}|${d.gpu}|${d.reason}`;
    if (this.seen.has(key)) return;
    this.seen.add(key);
    this.decisions.push(d);
    if (this.decisions.length > 2000) {
      const old = this.decisions.splice(0, this.decisions.length - 2000);
      for (const o of old) this.seen.delete(`${o.time}|${o.pid}|${o.action}|${o.gpu}|${o.reason}`);
    }
    if (live) this.emit('decision', d);
  }

  addPreemption(d) {
    this.mergePreemptions([d]);
    this.emit('decision', d);
  }

  // mergePreemptions adds preemptions not already kept (the REST list and
  // the stream overlap), oldest first, at most 5000.
  mergePreemptions(list) {
    const key = (d) => `${d.time}|${d.pid}|${d.action}|${d.gpu}`;
    const have = new Set(this.preemptions.map(key));
    for (const d of list) if (!have.has(key(d))) { have.add(key(d)); this.preemptions.push(d); }
    this.preemptions.sort((a, b) => a.time - b.time);
    if (this.preemptions.length > 5000) this.preemptions.splice(0, this.preemptions.length - 5000);
  }
}

// Stream keeps the event stream open: on loss it tells the store (the
// console shows a banner) and reconnects with exponential backoff from 1 s
// to 30 s, with jitter so that many consoles do not reconnect at once.
export class Stream {
  constructor(store) {
    this.store = store;
    this.es = null;
    this.attempt = 0;
    this.timer = 0;
    this.retryAt = 0;
  }

  open() {
    clearTimeout(this.timer);
    this.timer = 0;
    if (this.es) this.es.close();
    const es = new EventSource(`${base}/events`);
    this.es = es;
    es.addEventListener('open', () => {
      this.attempt = 0;
      this.store.emit('stream', { up: true });
    });
    es.addEventListener('snapshot', (ev) => {
      try { this.store.streamed(JSON.parse(ev.data)); } catch (e) { console.warn('console: bad snapshot event:', e.message); }
    });
    es.addEventListener('preemption', (ev) => {
      try { this.store.addPreemption(JSON.parse(ev.data)); } catch (e) { console.warn('console: bad preemption event:', e.message); }
    });
    es.addEventListener('decision', (ev) => {
      try { this.store.addDecision(JSON.parse(ev.data), true); } catch (e) { console.warn('console: bad decision event:', e.message); }
    });
    es.addEventListener('error', () => {
      // EventSource retries by itself only while the server answers; take
      // over so that the delay backs off and the banner can count down.
      es.close();
      if (this.es !== es) return;
      this.es = null;
      this.attempt++;
      const delay = Math.min(30000, 1000 * 2 ** (this.attempt - 1)) * (0.8 + 0.4 * Math.random());
      this.retryAt = Date.now() + delay;
      this.store.emit('stream', { up: false, attempt: this.attempt, retryAt: this.retryAt });
      this.timer = setTimeout(() => this.open(), delay);
    });
  }

  // now reconnects at once.
  now() { this.open(); }
}
