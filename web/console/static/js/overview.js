// Overview: the node at a glance — totals, each SLO class's attainment
// against its objective, the GPUs and who is on them, the classes.

import { $, h, replace, classChip } from './dom.js';
import { count, dur, pct } from './format.js';

// stat reads an engine counter whichever way the API spells it.
export function stat(stats, name) {
  if (!stats) return 0;
  return stats[name] ?? stats[name.toLowerCase()] ?? stats[name.replace(/[A-Z]/g, (c, i) => (i ? '_' : '') + c.toLowerCase())] ?? 0;
}

export class Overview {
  constructor(store) {
    this.store = store;
    store.on('snapshot', (s) => this.render(s));
  }

  render(s) {
    const procs = s.processes;
    const byPID = new Map(procs.map((p) => [p.pid, p]));
    const managed = procs.filter((p) => p.level !== 'observe').length;
    const limited = procs.filter((p) => p.limit).length;
    const held = procs.filter((p) => p.state !== 'running').length;
    const sloClasses = s.classes.filter((c) => c.latency && c.latency.has_slo);
    const missing = sloClasses.filter((c) => c.latency.attainment >= 0 && c.latency.attainment < c.latency.percentile / 100).length;
    const errors = stat(s.stats, 'EnforceErrors');
    const policy = s.status && s.status.policy;
    replace($('ov-tiles'),
      tile('Processes', procs.length, `${managed} managed · ${procs.length - managed} observed only`),
      tile('Held now', held, 'suspended or gated', held > 0 ? '' : ''),
      tile('SLO classes', sloClasses.length, missing ? `${missing} below objective` : 'all meeting objective', missing ? 'bad' : ''),
      tile('Weaker than planned', limited, 'enforcement the node cannot apply', limited ? 'warn' : ''),
      tile('Requests', count(stat(s.stats, 'Requests')), `${count(stat(s.stats, 'Suspends'))} suspends · ${count(stat(s.stats, 'Gates'))} gates`),
      tile('Enforcement errors', count(errors), 'failed driver or gate calls', errors ? 'bad' : ''),
      policy ? tile('Policy revision', String(policy.revision || '—').slice(0, 12), policy.last_error ? `last change refused: ${policy.last_error}` : `${policy.reloads ?? 0} reloads · ${policy.rejected ?? 0} refused`, policy.last_error ? 'warn' : '') : null,
    );

    replace($('ov-slo'), sloClasses.length ? sloClasses.map(sloCard)
      : h('p', { class: 'muted' }, 'No class has an SLO. Latency-critical classes get one from the policy.'));

    replace($('ov-gpus'), s.gpus.length ? s.gpus.map((g) => gpuCard(g, byPID))
      : h('p', { class: 'muted' }, 'No GPU in use yet.'));

    replace($('ov-classes'), s.classes.length ? classTable(s.classes) : h('p', { class: 'muted' }, 'No process classified yet.'));
  }
}

function tile(k, v, sub, tone) {
  const long = String(v).length > 8;
  return h('div', { class: `tile ${tone || ''}` }, h('div', { class: 'k' }, k), h('div', { class: `v ${long ? 'long' : ''}` }, String(v)), h('div', { class: 's' }, sub || ''));
}

function sloCard(c) {
  const l = c.latency;
  const obj = l.percentile / 100;
  const noData = l.attainment < 0;
  const miss = !noData && l.attainment < obj;
  const fill = h('div', { class: 'fill' });
  const target = h('div', { class: 'target', title: `objective ${l.percentile}%` });
  // The bar shows attainment from 90% to 100%, where SLOs live.
  const scale = (f) => `${Math.max(0, Math.min(100, (f - 0.9) * 1000))}%`;
  fill.style.width = noData ? '0' : scale(l.attainment);
  target.style.left = scale(obj);
  return h('div', { class: `slo ${noData ? 'nodata' : miss ? 'miss' : ''}` },
    h('div', { class: 'slo-head' },
      h('span', { class: 'slo-name' }, classChip(c.name)),
      h('span', { class: 'slo-att', title: 'requests within target over the window' }, noData ? 'no requests' : pct(l.attainment))),
    h('div', { class: 'slo-bar', role: 'img', 'aria-label': `attainment ${pct(l.attainment)} against objective ${l.percentile}%` }, fill, target),
    h('div', { class: 'slo-meta' },
      h('span', null, `objective p${l.percentile} ≤ ${dur(l.target_ns)}`),
      h('span', null, `p50 ${dur(l.p50_ns)}`),
      h('span', { class: l.p99_ns > l.target_ns ? 'bad' : '' }, `p99 ${dur(l.p99_ns)}`),
      h('span', null, `${count(l.window_requests)} req in ${dur(l.window_ns)}`),
      h('span', null, c.escalated ? 'suspending best-effort' : 'timeslices only')));
}

function gpuCard(g, byPID) {
  const active = g.active || [];
  const heldPIDs = g.held || [];
  const who = (pid) => {
    const p = byPID.get(pid);
    return h('li', null, p ? classChip(p.class) : null, h('span', { class: 'name' }, p ? p.comm || String(pid) : String(pid)), h('span', { class: 'muted' }, `pid ${pid}`));
  };
  return h('div', { class: `gpu ${active.length ? 'busy' : ''}` },
    h('div', { class: 'gpu-title' }, `GPU ${g.index}`, h('span', { class: 'gpu-state' }, active.length ? 'serving latency-critical' : 'idle for latency-critical')),
    h('div', { class: 'muted' }, [g.name, `${g.processes} process${g.processes === 1 ? '' : 'es'}`].filter(Boolean).join(' · ')),
    active.length ? [h('div', { class: 'muted' }, 'Active requests'), h('ul', null, active.map(who))] : null,
    heldPIDs.length ? [h('div', { class: 'muted' }, 'Held off'), h('ul', null, heldPIDs.map(who))] : null);
}

function classTable(classes) {
  const sorted = [...classes].sort((a, b) => b.priority - a.priority || a.name.localeCompare(b.name));
  return h('div', { class: 'table-wrap' }, h('table', { class: 'grid classes' },
    h('thead', null, h('tr', null,
      h('th', { scope: 'col' }, 'Class'), h('th', { scope: 'col', class: 'num' }, 'Processes'), h('th', { scope: 'col', class: 'num' }, 'Priority'),
      h('th', { scope: 'col' }, 'Kind'), h('th', { scope: 'col', class: 'num' }, 'GPU share cap'), h('th', { scope: 'col', class: 'num' }, 'p99'))),
    h('tbody', null, sorted.map((c) => h('tr', null,
      h('td', null, classChip(c.name)),
      h('td', { class: 'num' }, String(c.members)),
      h('td', { class: 'num' }, String(c.priority)),
      h('td', null, c.latency_critical ? 'latency-critical' : 'best-effort'),
      h('td', { class: 'num' }, c.max_gpu_share > 0 && c.max_gpu_share < 1 ? pct(c.max_gpu_share, 0) : 'none'),
      h('td', { class: 'num' }, dur(c.latency && c.latency.p99_ns)))))));
}
