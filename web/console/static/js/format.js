// Formatting of the engine's numbers for people.

// dur formats nanoseconds.
export function dur(ns) {
  if (ns === undefined || ns === null || ns <= 0) return '—';
  if (ns < 1e3) return `${ns} ns`;
  if (ns < 1e6) return `${(ns / 1e3).toFixed(ns < 1e4 ? 1 : 0)} µs`;
  if (ns < 1e9) return `${(ns / 1e6).toFixed(ns < 1e7 ? 2 : 1)} ms`;
  return `${(ns / 1e9).toFixed(2)} s`;
}

// pct formats a 0..1 fraction; negative means no data.
export function pct(f, digits = 2) {
  if (f === undefined || f === null || f < 0) return '—';
  return `${(100 * f).toFixed(digits)}%`;
}

export function count(n) {
  if (n === undefined || n === null) return '—';
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}

export function rate(r) {
  if (!isFinite(r)) return '—';
  if (r >= 1000) return `${(r / 1000).toFixed(1)}k/s`;
  return `${r.toFixed(r < 10 ? 1 : 0)}/s`;
}

// clock formats a wall-clock Date as HH:MM:SS.
export function clock(d) {
  return d.toLocaleTimeString([], { hour12: false });
}

// ago says how long before now a wall-clock time was.
export function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s ago`;
  return `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m ago`;
}

// levels, weakest to strongest (sched.Level).
export const levels = ['observe', 'timeslice', 'suspend', 'gate'];

// attainmentPercentile: the SLO objective as a fraction (99 -> 0.99).
export function objective(lat) {
  return lat && lat.percentile ? lat.percentile / 100 : 0;
}
