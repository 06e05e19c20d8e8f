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
// stats, status }. The event stream (its delta form) sends the whole state
// once and then deltas, which the store applies to its copy; the REST API
// fills the store before the stream's first event. wall is the browser's
// clock when the snapshot arrived: the engine's clock (time) is monotonic,
// so wall-clock times of engine events are wall - (time - event.time).
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
    // The stream's state: its sequence number, the processes by pid, the
    // classes and GPUs.
    this.live = null;
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
    const [status, procs, decisions, preemptions, classes, gpus] = await Promise.all(
      ['/status', '/processes', '/decisions', '/preemptions', '/classes', '/gpus'].map((p) => get(p)));
    for (const d of list(decisions, 'decisions')) this.addDecision(d, false);
    this.mergePreemptions(list(preemptions, 'decisions'));
    if (seq !== this.seq) {
      this.emit('decision', null); // the stream's state is newer; the log is not
      return;
    }
    this.update(status, list(procs, 'processes'), list(classes, 'classes'), list(gpus, 'gpus'));
  }

  // streamed takes a snapshot event's data: the stream's whole state.
  streamed(ev) {
    if (!ev || !ev.seq || !ev.status || !Array.isArray(ev.processes)) throw new Error('snapshot event without seq, status and processes');
    this.live = { seq: ev.seq, procs: new Map(ev.processes.map((p) => [p.pid, p])), classes: ev.classes || [], gpus: ev.gpus || [] };
    this.streamedState(ev.status);
  }

  // delta applies a delta event's data to the stream's state: the fields
  // of each process it names replace the store's, new processes come
  // whole, removed ones go. A delta that does not follow the state held
  // is refused (the stream then starts again from a snapshot).
  delta(ev) {
    const live = this.live;
    if (!live) throw new Error('delta event before the snapshot event');
    if (!ev || ev.seq !== live.seq + 1 || !ev.status) throw new Error(`delta event ${ev && ev.seq} does not follow state ${live.seq}`);
    for (const p of ev.processes || []) {
      const old = live.procs.get(p.pid);
      live.procs.set(p.pid, old ? { ...old, ...p } : p);
    }
    for (const pid of ev.removed || []) live.procs.delete(pid);
    if (ev.classes) live.classes = ev.classes;
    if (ev.gpus) live.gpus = ev.gpus;
    live.seq = ev.seq;
    this.streamedState(ev.status);
  }

  streamedState(status) {
    ++this.seq; // a REST refresh still in flight is older
    const procs = [...this.live.procs.values()].sort((a, b) => a.pid - b.pid);
    this.update(status, procs, this.live.classes, this.live.gpus);
  }

  update(status, processes, classes, gpus) {
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
    const es = new EventSource(`${base}/events?form=delta`);
    this.es = es;
    es.addEventListener('open', () => {
      this.attempt = 0;
      this.store.emit('stream', { up: true });
    });
    es.addEventListener('snapshot', (ev) => {
      try { this.store.streamed(JSON.parse(ev.data)); } catch (e) { console.warn('console: bad snapshot event:', e.message); }
    });
    es.addEventListener('delta', (ev) => {
      try {
        this.store.delta(JSON.parse(ev.data));
      } catch (e) {
        // Start again from a whole snapshot rather than show a wrong state.
        console.warn('console: bad delta event, reconnecting:', e.message);
        if (this.es === es) this.open();
      }
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
