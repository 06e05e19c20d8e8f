// Charts: series the console builds from the snapshots it receives (the
// API keeps no history), drawn with uPlot; and the preemption timeline,
// drawn on a canvas from the engine's recent preemptions.

import { $, h, replace, palette, classColor, classChip } from './dom.js';
import { dur } from './format.js';
import { get, list } from './api.js';

const windowSeconds = 300;

export class Charts {
  constructor(store) {
    this.store = store;
    this.shown = false;
    this.t = [];          // wall-clock seconds of each sample
    this.lat = new Map(); // LC class -> {p50: [], p99: [], target: []}
    this.be = [];         // best-effort launches/s
    this.rate = new Map(); // class -> launches/s
    this.prev = null;     // previous snapshot's launches per pid, and its time
    this.plots = {};
    this.keys = {};
    this.els = {};
    $('ch-window').textContent = String(windowSeconds / 60);
    store.on('snapshot', (s) => this.sample(s));
    window.addEventListener('resize', () => this.resize());
  }

  visible(on) {
    this.shown = on;
    clearInterval(this.poll);
    if (!on) return;
    this.draw();
    this.fetchPreemptions();
    this.poll = setInterval(() => this.fetchPreemptions(), 2000);
  }

  // fetchPreemptions reads the engine's recent preemptions, which come at
  // request rate and so are not all in every snapshot event.
  async fetchPreemptions() {
    try {
      const doc = await get('/preemptions');
      this.store.mergePreemptions(list(doc, 'decisions'));
      this.timeline();
    } catch (e) {
      console.warn('console:', e.message);
    }
  }

  // sample appends one point per series from a snapshot.
  sample(s) {
    const now = this.store.wall / 1000;
    if (this.t.length && now - this.t[this.t.length - 1] < 0.2) return;
    const launches = new Map(s.processes.map((p) => [p.pid, p]));
    const byClass = new Map();
    let be = 0;
    if (this.prev) {
      const dt = (s.time - this.prev.time) / 1e9;
      if (dt > 0) {
        for (const [pid, p] of launches) {
          const before = this.prev.launches.get(pid);
          // The API's own rate when it gives one; else from the counts.
          const d = p.launch_rate ?? Math.max(0, p.launches - (before === undefined ? p.launches : before)) / dt;
          byClass.set(p.class, (byClass.get(p.class) || 0) + d);
          if (!p.latency_critical) be += d;
        }
      }
    }
    this.prev = { time: s.time, launches: new Map(s.processes.map((p) => [p.pid, p.launches])) };
    const n = this.t.length;
    this.t.push(now);
    for (const c of s.classes) {
      if (!c.latency_critical) continue;
      if (!this.lat.has(c.name)) this.lat.set(c.name, { p50: Array(n).fill(null), p99: Array(n).fill(null), target: Array(n).fill(null) });
    }
    for (const [name, ser] of this.lat) {
      const c = s.classes.find((x) => x.name === name);
      const l = c && c.latency;
      ser.p50.push(l && l.requests ? l.p50_ns / 1e6 : null);
      ser.p99.push(l && l.requests ? l.p99_ns / 1e6 : null);
      ser.target.push(l && l.has_slo ? l.target_ns / 1e6 : null);
    }
    this.be.push(n === 0 ? null : be);
    for (const c of s.classes) if (!this.rate.has(c.name)) this.rate.set(c.name, Array(n).fill(null));
    for (const [name, ser] of this.rate) ser.push(n === 0 ? null : (byClass.get(name) ?? 0));
    this.trim(now);
    if (this.shown) this.draw();
  }

  trim(now) {
    let k = 0;
    while (k < this.t.length && this.t[k] < now - windowSeconds) k++;
    if (!k) return;
    this.t.splice(0, k);
    this.be.splice(0, k);
    for (const ser of this.lat.values()) for (const a of Object.values(ser)) a.splice(0, k);
    for (const a of this.rate.values()) a.splice(0, k);
  }

  draw() {
    if (typeof uPlot === 'undefined') return;
    this.latency();
    this.plot('be', $('ch-be'), [{ label: 'best-effort', stroke: palette[1], fill: 'rgba(121,192,255,0.12)', width: 2, value: perSec }],
      [this.t, this.be], 'launches/s');
    const rateSeries = [];
    const rateData = [this.t];
    for (const [name, ser] of this.rate) {
      rateSeries.push({ label: name, stroke: palette[classColor(name)], width: 2, value: perSec });
      rateData.push(ser);
    }
    this.plot('launch', $('ch-launch'), rateSeries, rateData, 'launches/s');
    this.timeline();
  }

  // latency draws one chart per latency-critical class: its p50 and p99
  // and its SLO target, each on its own scale (targets differ by orders
  // of magnitude between classes).
  latency() {
    const host = $('ch-latency');
    if (!this.lat.size) {
      if (!host.firstChild) host.appendChild(h('p', { class: 'muted' }, 'No latency-critical class yet.'));
      return;
    }
    if (host.firstChild && host.firstChild.tagName === 'P') host.replaceChildren();
    const s = this.store.snapshot;
    for (const [name, ser] of this.lat) {
      const id = `lat-${name}`;
      let box = this.boxes?.get(name);
      if (!box) {
        this.boxes ??= new Map();
        const title = h('div', { class: 'lat-title' });
        const chart = h('div', { class: 'chart' });
        box = { title, chart };
        this.boxes.set(name, box);
        host.appendChild(h('div', null, title, chart));
      }
      const c = s && s.classes.find((x) => x.name === name);
      const l = c && c.latency;
      replace(box.title, classChip(name), l && l.has_slo ? `objective: p${l.percentile} ≤ ${dur(l.target_ns)} over ${dur(l.window_ns)}` : 'no SLO');
      const color = palette[classColor(name)];
      this.plot(id, box.chart, [
        { label: 'p50', stroke: color, width: 1.5, dash: [6, 4], value: ms },
        { label: 'p99', stroke: color, width: 2.5, value: ms },
        { label: 'SLO target', stroke: '#f85149', width: 1.5, dash: [3, 3], value: ms },
      ], [this.t, ser.p50, ser.p99, ser.target], 'ms', 200);
    }
  }

  // plot draws into el, rebuilding the chart when its series change.
  plot(id, el, series, data, unit, height = 240) {
    const key = series.map((s) => s.label).join('|');
    const width = Math.max(300, el.clientWidth || 560);
    this.els[id] = { el, height };
    if (this.plots[id] && this.keys[id] === key) {
      this.plots[id].setData(data);
      return;
    }
    this.plots[id]?.destroy();
    replace(el);
    if (!series.length) {
      el.appendChild(h('p', { class: 'muted' }, 'No data yet.'));
      this.plots[id] = null;
      return;
    }
    const axis = { stroke: '#8d99a8', grid: { stroke: '#232b36', width: 1 }, ticks: { stroke: '#2b3440', width: 1 } };
    this.keys[id] = key;
    this.plots[id] = new uPlot({
      width, height,
      cursor: { drag: { x: false, y: false } },
      legend: { live: false },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
      axes: [axis, { ...axis, label: unit, labelSize: 18, size: 60 }],
      series: [{ value: '{HH}:{mm}:{ss}' }, ...series.map((s) => ({ points: { show: false }, ...s }))],
    }, data, el);
  }

  resize() {
    for (const [id, p] of Object.entries(this.plots)) {
      if (!p) continue;
      const { el, height } = this.els[id];
      p.setSize({ width: Math.max(300, el.clientWidth), height });
    }
    if (this.shown) this.timeline();
  }

  // timeline draws, per GPU, one row per process that was held off it,
  // with a bar for each suspension or gate, over the span the engine's
  // recent preemptions cover.
  timeline() {
    const el = $('ch-preempt');
    const s = this.store.snapshot;
    if (!s) return;
    const pre = [...(this.store.preemptions || [])].sort((a, b) => a.time - b.time);
    if (!pre.length) {
      replace(el, h('p', { class: 'muted' }, 'No preemption yet: nothing was suspended or gated.'));
      return;
    }
    const gpusOf = new Map(s.processes.map((p) => [p.pid, p.gpus && p.gpus.length ? p.gpus : [0]]));
    const comm = new Map(s.processes.map((p) => [p.pid, p.comm]));
    for (const d of pre) if (d.comm) comm.set(d.pid, d.comm);
    const rows = new Map(); // "gpu|pid" -> {gpu, pid, bars: [{from, to, kind}], open: {}}
    const end = s.time;
    // The span is what is kept, at least a second and at most a minute.
    const start = Math.max(Math.min(pre[0].time, end - 1e9), end - 60e9);
    const row = (gpu, pid) => {
      const k = `${gpu}|${pid}`;
      if (!rows.has(k)) rows.set(k, { gpu, pid, bars: [], open: {}, seen: false });
      return rows.get(k);
    };
    // The list can have gaps: the engine keeps the latest preemptions and
    // the stream sends at most so many per update. A bar is drawn only
    // between a start and its end both seen; an end whose start was lost
    // after earlier events of the process, or a start whose end was lost,
    // is drawn as a mark at its own time, never as a bar across the gap.
    const mark = 2e5;
    for (const d of pre) {
      const gpus = d.gpu >= 0 ? [d.gpu] : gpusOf.get(d.pid) || [0];
      for (const g of gpus) {
        const r = row(g, d.pid);
        const kind = { suspend: 'suspended', resume: 'suspended', gate: 'gated', ungate: 'gated', hold: 'held' }[d.action];
        if (!kind) continue;
        if (d.action === 'suspend' || d.action === 'gate') {
          if (r.open[kind] !== undefined) r.bars.push({ from: r.open[kind], to: r.open[kind] + mark, kind });
          r.open[kind] = d.time;
        } else if (d.action === 'hold') r.bars.push({ from: d.time, to: d.time + mark, kind });
        else {
          r.bars.push({ from: r.open[kind] ?? (r.seen ? d.time - mark : start), to: d.time, kind });
          delete r.open[kind];
        }
        r.seen = true;
      }
    }
    for (const r of rows.values()) for (const [kind, from] of Object.entries(r.open)) r.bars.push({ from, to: end, kind });
    const sorted = [...rows.values()].sort((a, b) => a.gpu - b.gpu || a.pid - b.pid);

    const rowH = 22, gpuGap = 26, labelW = 190, top = 8, axisH = 22;
    let y = top;
    const layout = [];
    let lastGPU = null;
    for (const r of sorted) {
      if (r.gpu !== lastGPU) { layout.push({ header: r.gpu, y }); y += gpuGap; lastGPU = r.gpu; }
      layout.push({ r, y }); y += rowH;
    }
    const height = y + axisH;
    const width = Math.max(400, el.clientWidth || 900);
    const dpr = window.devicePixelRatio || 1;
    let canvas = el.querySelector('canvas');
    if (!canvas) {
      replace(el);
      canvas = h('canvas', { role: 'img' });
      el.appendChild(canvas);
    }
    canvas.setAttribute('aria-label', `preemptions of ${sorted.length} processes over ${dur(end - start)}`);
    canvas.width = width * dpr;
    canvas.height = height * dpr;
    canvas.style.height = `${height}px`;
    const g = canvas.getContext('2d');
    g.scale(dpr, dpr);
    g.clearRect(0, 0, width, height);
    g.font = '12px system-ui, sans-serif';
    g.textBaseline = 'middle';
    const css = getComputedStyle(document.documentElement);
    const color = { suspended: css.getPropertyValue('--suspended'), gated: css.getPropertyValue('--gated'), held: css.getPropertyValue('--held') };
    const x = (t) => labelW + (width - labelW - 10) * (Math.max(t, start) - start) / (end - start);
    for (const item of layout) {
      if (item.header !== undefined) {
        g.fillStyle = '#e6edf3';
        g.font = '600 12px system-ui, sans-serif';
        g.fillText(`GPU ${item.header}`, 4, item.y + gpuGap / 2);
        g.font = '12px system-ui, sans-serif';
        g.fillStyle = '#2b3440';
        g.fillRect(labelW, item.y + gpuGap / 2, width - labelW - 10, 1);
        continue;
      }
      const r = item.r;
      g.fillStyle = '#8d99a8';
      // Canvas text is drawn, never parsed: a hostile name stays text.
      g.fillText(`${clip(comm.get(r.pid) || '', 18)} (${r.pid})`, 12, item.y + rowH / 2);
      g.fillStyle = '#1c232c';
      g.fillRect(labelW, item.y + 3, width - labelW - 10, rowH - 6);
      for (const b of r.bars) {
        g.fillStyle = color[b.kind];
        g.fillRect(x(b.from), item.y + 4, Math.max(1.5, x(b.to) - x(b.from)), rowH - 8);
      }
    }
    g.fillStyle = '#8d99a8';
    const ticks = 6;
    for (let i = 0; i <= ticks; i++) {
      const t = start + (end - start) * i / ticks;
      const label = `-${dur(end - t)}`;
      g.textAlign = i === 0 ? 'left' : i === ticks ? 'right' : 'center';
      g.fillText(i === ticks ? 'now' : label, x(t), height - axisH / 2);
    }
    g.textAlign = 'left';
  }
}

function clip(s, n) { return s.length > n ? `${s.slice(0, n - 1)}…` : s; }
function ms(u, v) { return v == null ? '—' : `${v.toFixed(2)} ms`; }
function perSec(u, v) { return v == null ? '—' : `${v.toFixed(0)}/s`; }
