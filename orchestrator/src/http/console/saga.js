// One saga's page: its header, its timeline of attempts and the panels beside it.

import {
  STOPPED, FINISHED, UNKNOWN_OUTCOMES, FAILED_OUTCOMES, SAGA_POLL_MS, ZOOMS, EXPAND_BRANCHES_UP_TO, state,
} from './state.js';
import { ApiError, describe, api, can, serverWasAt, serverNow } from './api.js';
import {
  el, localFormat, ms, dayOf, needsDate, clockText, timeEl, fmtDur, badge, shortId, fill, pretty,
  main, update, refreshNotice, showCounts, waitEl,
} from './ui.js';
import { showLogin } from './login.js';
import { poll } from './poll.js';
import { actionBar } from './actions.js';

// ---- one saga -----------------------------------------------------------------------------

function viewOf(id) {
  return state.view[id] || (state.view[id] = { zoom: 1, folded: new Map(), selected: null, lane: null, tableOpen: new Set() });
}

/**
 * Whether a group's branches are folded into its lane: as the user last chose, else when there
 * are more than can be read at once. Decided for each group as it is drawn, so a group that
 * starts or grows while the page is open folds too.
 */
function isFolded(view, group) {
  if (view.folded.has(group.name)) return view.folded.get(group.name);
  return (group.branches || []).length > EXPAND_BRANCHES_UP_TO;
}

/** The last time anything happened to the saga: its last change or its latest attempt's end. */
function lastActivity(saga, attempts) {
  let end = ms(saga.updated_at);
  for (const a of attempts) end = Math.max(end, ms(a.ended_at) || ms(a.started_at));
  return end;
}

export async function renderSaga(id) {
  document.title = `Saga ${shortId(id)}`;
  fill(main(), el('p', { class: 'muted' }, 'Loading…'));
  const page = {
    id,
    saga: null,
    attempts: [],
    events: [],
    deliveries: [],
    texts: {}, // each list as last fetched, to tell whether it changed
    drawn: {}, // what each region shows, to draw it only when that changes
    polls: 0,
    header: el('div'),
    timeline: el('section', { 'aria-labelledby': 't-title' }),
    panels: el('div', { class: 'panels' }),
  };
  let scaffolded = false;
  const tick = async (current) => {
    const [saga, counts] = await Promise.all([api(`/v1/sagas/${id}`), api('/v1/counts')]);
    serverWasAt(saga.updated_at);
    const sagaText = JSON.stringify(saga);
    // Every attempt started or ended, and nearly every event, changes the saga (its steps or
    // its updated_at), so its lists are read again only then. A signal that arrives before
    // the saga waits for it is the exception: its event is read at least every 10 s.
    const changed = sagaText !== page.texts.saga;
    page.polls += 1;
    const pending = page.deliveries.some((d) => d.state === 'pending');
    const [attempts, events, deliveries] = await Promise.all([
      changed ? api(`/v1/sagas/${id}/attempts`) : null,
      changed || (!STOPPED.has(saga.status) && page.polls % 5 === 0) ? api(`/v1/sagas/${id}/events`) : null,
      // Deliveries go on after the saga: a pending one is read every 6 s.
      changed || (pending && page.polls % 3 === 0) ? api(`/v1/sagas/${id}/deliveries`) : null,
    ]);
    if (!current()) return false;
    page.saga = saga;
    page.texts.saga = sagaText;
    if (attempts) {
      page.attempts = attempts.attempts;
      page.texts.attempts = JSON.stringify(attempts);
    }
    if (events) {
      page.events = events.events;
      page.texts.events = JSON.stringify(events);
    }
    if (deliveries) {
      page.deliveries = deliveries.deliveries;
      page.texts.deliveries = JSON.stringify(deliveries);
    }
    showCounts(counts, null);
    if (!scaffolded) {
      fill(main(), el('p', {}, el('a', { href: '#/' }, '← All sagas')), page.header, page.timeline, page.panels);
      scaffolded = true;
    }
    const deferred = drawSaga(page);
    // A finished saga is polled on only for what it has yet to show.
    return !FINISHED.has(saga.status) || page.deliveries.some((d) => d.state === 'pending') || deferred;
  };
  const gone = 'this saga is no longer on the server (removed by retention?)';
  // After an action: read it again now, and poll again if it had stopped.
  state.refresh = () => {
    state.generation += 1;
    const generation = state.generation;
    poll(generation, tick, SAGA_POLL_MS, gone).catch((e) => {
      if (generation !== state.generation) return;
      if (e instanceof ApiError && e.status === 401) showLogin('The token was refused.');
      else refreshNotice(`Could not refresh: ${describe(e)}`, null);
    });
  };
  await poll(state.generation, tick, SAGA_POLL_MS, gone);
}

/**
 * Draws what changed of a saga's page: the header and the timeline also while it runs (its
 * time goes on), each region only if no text is selected in it (else at the next poll).
 * Answers whether a region was left for later.
 */
function drawSaga(page, force = {}) {
  const { saga } = page;
  const view = viewOf(saga.id);
  const live = !STOPPED.has(saga.status);
  const now = serverNow();
  document.title = `${saga.name} ${shortId(saga.id)} (${saga.status.toLowerCase()})`;
  const keys = {
    header: `${page.texts.saga}|${can('start')}|${can('operate')}`,
    timeline: `${page.texts.saga}|${page.texts.attempts}`,
    panels: `${page.texts.saga}|${page.texts.events}|${page.texts.deliveries}`,
  };
  const withDate = needsDate(ms(saga.created_at), live ? now : lastActivity(saga, page.attempts));
  const draw = {
    header: () => sagaHeader(saga, now),
    timeline: () => timelineOf(page, now, withDate),
    panels: () => panelsOf(page, withDate),
  };
  let deferred = false;
  for (const region of ['header', 'timeline', 'panels']) {
    const moving = live && region !== 'panels';
    if (!force[region] && !moving && keys[region] === page.drawn[region]) continue;
    if (update(page[region], draw[region](), force[region])) page.drawn[region] = keys[region];
    else deferred = true;
  }
  return deferred;
}

function sagaHeader(saga, now) {
  const stopped = STOPPED.has(saga.status);
  const lived = (stopped ? ms(saga.updated_at) : now) - ms(saga.created_at);
  const children = saga.stages.filter((s) => s.child_id);
  let since = ['Updated', timeEl(saga.updated_at)];
  let took = [saga.status === 'QUEUED' ? 'Queued for' : 'Running for', fmtDur(lived)];
  if (saga.status === 'FAILED') {
    // Not running: it waits for a person to retry or abort it.
    since = ['Waiting for an operator since', timeEl(saga.updated_at)];
    took = ['Ran for', fmtDur(lived)];
  } else if (saga.status === 'PAUSED') {
    // Not running: nothing starts and no timer fires until a person resumes it.
    since = ['Paused since', timeEl(saga.updated_at)];
    took = ['Ran for', fmtDur(lived)];
  } else if (stopped) {
    since = ['Ended', timeEl(saga.updated_at)];
    took = ['Took', fmtDur(lived)];
  }
  const meta = el('dl', { class: 'meta' },
    el('div', {}, el('dt', {}, 'Id'), el('dd', { class: 'mono' }, saga.id)),
    el('div', {}, el('dt', {}, 'Definition'), el('dd', {}, `${saga.name} v${saga.version}`,
      el('span', { class: 'muted mono' }, ` #${saga.definition_hash}`))),
    el('div', { dataset: { key: 'priority' } }, el('dt', {}, 'Priority'),
      el('dd', {}, saga.priority === 5 ? '5 (the default)' : `${saga.priority} (0 last, 9 first)`)),
    saga.attrs && Object.keys(saga.attrs).length ? el('div', { dataset: { key: 'attrs' } }, el('dt', {}, 'Attributes'),
      el('dd', { class: 'attrs' }, Object.entries(saga.attrs).map(([k, v]) =>
        el('a', { href: `#/?${new URLSearchParams({ attr: `${k}=${v}` })}`, class: 'attr', title: `Every saga with ${k}=${v}` }, `${k}=${v}`)))) : null,
    el('div', {}, el('dt', {}, 'Created'), el('dd', {}, timeEl(saga.created_at))),
    el('div', { dataset: { key: 'since' } }, el('dt', {}, since[0]), el('dd', {}, since[1])),
    el('div', { dataset: { key: 'took' } }, el('dt', {}, took[0]), el('dd', {}, took[1])),
    saga.scheduled_at ? el('div', { dataset: { key: 'scheduled' } }, el('dt', {}, 'Scheduled for'), el('dd', {}, timeEl(saga.scheduled_at))) : null,
    saga.next_run_at && !stopped ? el('div', { dataset: { key: 'next' } }, el('dt', {}, 'Next run'), el('dd', {}, timeEl(saga.next_run_at))) : null,
    saga.lease_owner ? el('div', { dataset: { key: 'lease' } }, el('dt', {}, 'Driven by'), el('dd', { class: 'mono' }, `${saga.lease_owner} (epoch ${saga.lease_epoch})`)) : null,
    saga.parent_id ? el('div', { dataset: { key: 'parent' } }, el('dt', {}, 'Parent'), el('dd', {},
      el('a', { href: `#/sagas/${saga.parent_id}`, class: 'mono', title: saga.parent_id, dataset: { focus: 'parent' } }, shortId(saga.parent_id)),
      saga.parent_stage ? ` (stage ${saga.parent_stage})` : '')) : null,
    saga.forked_from ? el('div', { dataset: { key: 'forked-from' } }, el('dt', {}, 'Forked from'), el('dd', {},
      el('a', { href: `#/sagas/${saga.forked_from.saga_id}`, class: 'mono', title: saga.forked_from.saga_id, dataset: { focus: 'forked from' } }, shortId(saga.forked_from.saga_id)),
      saga.forked_from.stage ? ` (from stage ${saga.forked_from.stage})` : '')) : null,
    saga.superseded_by ? el('div', { dataset: { key: 'superseded' } }, el('dt', {}, 'Superseded by'), el('dd', {},
      el('a', { href: `#/sagas/${saga.superseded_by}`, class: 'mono', title: saga.superseded_by, dataset: { focus: 'superseded by' } }, shortId(saga.superseded_by)))) : null,
    children.length ? el('div', { dataset: { key: 'children' } }, el('dt', {}, 'Children'), el('dd', {}, children.map((c) =>
      el('span', { dataset: { key: c.child_id } },
        el('a', { href: `#/sagas/${c.child_id}`, class: 'mono', title: c.child_id, dataset: { focus: `child ${c.child_id}` } }, shortId(c.child_id)),
        ` (${c.name}) `)))) : null);
  return [
    el('h1', {}, saga.name, badge(saga.status),
      saga.needs_attention ? el('span', { class: 'badge flagbadge' }, 'needs attention') : null,
      saga.blocked ? el('span', { class: 'badge flagbadge' }, 'blocked: no running process has this definition') : null,
      saga.cancel_requested && !stopped ? el('span', { class: 'badge flagbadge' }, 'cancel requested') : null,
      saga.waiting_for ? el('span', { class: 'badge s-WAITING', dataset: { key: 'waiting' } }, 'waiting for ', waitEl(saga)) : null,
      saga.pivot_reached ? el('span', { class: 'badge s-NOT_NEEDED' }, 'past its point of no return') : null),
    saga.error ? el('p', { class: 'notice', role: 'note', dataset: { key: 'error' } }, saga.error) : null,
    meta,
    actionBar(saga),
  ];
}

// ---- the timeline -------------------------------------------------------------------------

function stepsOf(saga) {
  const lanes = [];
  for (const stage of saga.stages) {
    const kind = stage.kind === 'step' ? stage.step_kind : stage.kind;
    lanes.push({ key: stage.name, label: stage.name, kind, rec: stage, stage, depth: 0 });
    for (const b of stage.branches || []) {
      lanes.push({
        key: b.name, label: b.name.slice(stage.name.length + 1), kind: 'branch', rec: b, stage, depth: 1,
      });
    }
  }
  return lanes;
}

/**
 * The time range drawn: the saga's life, stretched to show near deadlines. A saga that is not
 * driven any more (finished, or FAILED and waiting for a person) ends at its last activity;
 * one that is, at the present.
 */
function axisOf(saga, attempts, now) {
  const t0 = ms(saga.created_at);
  const live = !STOPPED.has(saga.status);
  const last = lastActivity(saga, attempts);
  const end = live ? Math.max(now, last) : last;
  const lived = Math.max(end - t0, 1);
  const deadlines = [];
  if (live) {
    const walk = (rec) => {
      if (rec.status !== 'WAITING' && rec.status !== 'RETRYING') return;
      for (const d of [rec.wake_at, rec.timeout_at]) if (d) deadlines.push(ms(d));
    };
    for (const stage of saga.stages) {
      walk(stage);
      (stage.branches || []).forEach(walk);
    }
    if (saga.next_run_at) deadlines.push(ms(saga.next_run_at));
  }
  let t1 = end;
  for (const d of deadlines) {
    // A deadline soon enough is drawn in place; a far one is named at the edge instead, so
    // that an hour's timeout does not squash a second of calls into a pixel.
    if (d > t1 && d - t0 <= lived * 4) t1 = d;
  }
  t1 += (t1 - t0) * 0.02 + 1;
  // `until`: where what has not ended (a running call, a wait) ends on the drawing.
  return { t0, t1, span: t1 - t0, now, live, until: end };
}

function pct(axis, t) {
  return `${(((t - axis.t0) / axis.span) * 100).toFixed(4)}%`;
}

function widthPct(axis, from, to) {
  return `${((Math.max(to - from, 0) / axis.span) * 100).toFixed(4)}%`;
}

function ticks(axis, zoom, withDate) {
  // About one label per 150 pixels of a track as wide as the screen allows.
  const labels = Math.max(3, Math.floor(((window.innerWidth - 240) * zoom) / 150));
  const target = axis.span / labels;
  const pow = 10 ** Math.floor(Math.log10(target));
  const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= target) || target;
  const out = [];
  for (let t = 0; t <= axis.span; t += step) {
    out.push(el('div', { class: 'tick', style: `left:${pct(axis, axis.t0 + t)}`, 'aria-hidden': 'true' },
      t === 0 ? clockText(axis.t0, withDate) : `+${fmtDur(t)}`));
  }
  return out;
}

function outcomeClass(a, running) {
  if (running) return 'running';
  if (FAILED_OUTCOMES.has(a.outcome)) return 'failed';
  if (UNKNOWN_OUTCOMES.has(a.outcome) || !a.outcome) return 'unknown';
  return 'ok';
}

function attemptBar(axis, lane, a, view, select) {
  // An attempt with no end in a saga nothing drives any more will not end: its outcome is unknown.
  const open = !a.outcome && !a.ended_at;
  const running = open && axis.live;
  const start = ms(a.started_at);
  const end = open ? axis.until : ms(a.ended_at) || start;
  const cls = outcomeClass(a, running);
  const phase = a.phase === 'compensation' ? 'undo' : 'action';
  // The phase is in the mark as well as in the pattern, so both read at a glance.
  const mark = (a.phase === 'compensation' ? '↩' : '') + (cls === 'failed' ? '✕' : cls === 'unknown' ? '?' : '');
  // A running call is named by its start, not its length, so the label stays the same while it runs.
  const outcome = running ? `running since ${clockText(start, false)}` : `${a.outcome || 'no result recorded'}, ${fmtDur(end - start)}`;
  const what = `${lane.key} ${phase} attempt ${a.attempt}: ${outcome}`;
  const key = `${a.step}|${a.phase}|${a.attempt}`;
  return el('button', {
    type: 'button',
    class: `bar ${a.phase} ${cls}`,
    style: `left:${pct(axis, start)};width:${widthPct(axis, start, end)}`,
    title: a.error ? `${what}: ${a.error}` : what,
    'aria-label': a.error ? `${what}: ${a.error}` : what,
    'aria-pressed': view.selected === key ? 'true' : 'false',
    dataset: { phase: a.phase, outcome: a.outcome || 'running', attempt: a.attempt, lane: lane.key, focus: `bar ${key}` },
    onclick: () => select(key),
  }, mark ? el('span', { class: 'mark', 'aria-hidden': 'true' }, mark) : null);
}

/** How many branches of a group failed, are stuck, run: shown on a folded group's lane. */
function branchTally(branches) {
  const tally = { failed: 0, stuck: 0, running: 0 };
  for (const b of branches) {
    const c = b.compensation.status;
    if (b.status === 'UNKNOWN' || c === 'UNKNOWN' || c === 'FAILED') tally.stuck += 1;
    else if (b.status === 'FAILED') tally.failed += 1;
    else if (['RUNNING', 'RETRYING', 'WAITING'].includes(b.status) || ['RUNNING', 'RETRYING'].includes(c)) tally.running += 1;
  }
  return tally;
}

function laneTrack(axis, lane, laneAttempts, saga, view, select, withDate) {
  const track = el('div', { class: 'tl-track', role: 'cell' });
  const rec = lane.rec;
  // Waits drawn as bars: sleeps, signal waits, child sagas, and a group's whole run.
  if (['sleep', 'signal', 'child', 'parallel'].includes(lane.kind) && rec.started_at) {
    const from = ms(rec.started_at);
    const to = rec.ended_at ? ms(rec.ended_at) : axis.until;
    const label = lane.kind === 'sleep' ? 'sleeping'
      : lane.kind === 'signal' ? `waiting for ${rec.waiting_for || 'a signal'}`
        : lane.kind === 'child' ? 'child saga' : `${(rec.branches || []).length} branches`;
    const attrs = {
      class: `bar ${lane.kind === 'child' ? 'childbar' : 'waitbar'}`,
      style: `left:${pct(axis, from)};width:${widthPct(axis, from, to)}`,
      title: `${lane.key}: ${label}, ${fmtDur(to - from)}`,
      'aria-label': `${lane.key}: ${label}${rec.ended_at || !axis.live ? `, ${fmtDur(to - from)}` : ''}`,
    };
    track.append(lane.kind === 'child' && rec.child_id
      ? el('a', { ...attrs, href: `#/sagas/${rec.child_id}`, dataset: { focus: `child bar ${lane.key}` } }, 'child')
      : el('span', { ...attrs, role: 'img' }, lane.kind === 'parallel' ? '' : label));
    if (rec.compensation && rec.compensation.started_at && lane.kind !== 'parallel') {
      const cf = ms(rec.compensation.started_at);
      const ct = rec.compensation.ended_at ? ms(rec.compensation.ended_at) : axis.until;
      const cs = rec.compensation.status;
      const cls = cs === 'FAILED' ? 'failed' : cs === 'UNKNOWN' ? 'unknown' : cs === 'RUNNING' && axis.live ? 'running' : 'ok';
      track.append(el('span', {
        class: `bar compensation ${cls}`, role: 'img', style: `left:${pct(axis, cf)};width:${widthPct(axis, cf, ct)}`,
        'aria-label': `${lane.key}: undoing, ${cs}`, title: `${lane.key}: undoing, ${cs}`,
      }));
    }
  }
  if (lane.kind === 'parallel' && isFolded(view, rec)) {
    // Folded, the group still says on its lane what needs looking at.
    const tally = branchTally(rec.branches || []);
    const parts = [
      tally.failed ? el('span', { class: 'badge mini s-FAILED' }, `✕ ${tally.failed} failed`) : null,
      tally.stuck ? el('span', { class: 'badge mini s-UNKNOWN' }, `? ${tally.stuck} stuck`) : null,
      tally.running ? el('span', { class: 'badge mini s-RUNNING' }, `▶ ${tally.running} running`) : null,
    ].filter(Boolean);
    if (parts.length) track.append(el('span', { class: 'group-sum' }, parts));
  }
  // Deadlines: a sleep's wake time, a signal's timeout, a retry's next attempt. Those in the
  // range are drawn in place, each label a line below the one before; the others are listed
  // at the lane's right edge.
  const beyond = [];
  let placed = 0;
  const deadline = (t, text) => {
    const day = withDate || dayOf(t) !== dayOf(axis.t0);
    if (t <= axis.t1) {
      const flip = (t - axis.t0) / axis.span > 0.7; // the label goes left of the line near the end
      track.append(el('div', { class: `deadline${flip ? ' flip' : ''}`, style: `left:${pct(axis, t)}`, title: `${text} ${new Date(t).toISOString()}` },
        el('span', { style: `top:${(placed * 0.8 - 0.1).toFixed(1)}rem` }, `${text} ${clockText(t, day)}`)));
      placed += 1;
    } else {
      beyond.push(el('span', { title: new Date(t).toISOString() }, `${text} ${localFormat.format(new Date(t))} →`));
    }
  };
  if (axis.live && rec.status === 'WAITING' && rec.wake_at) deadline(ms(rec.wake_at), 'wakes');
  if (axis.live && rec.status === 'WAITING' && rec.timeout_at) deadline(ms(rec.timeout_at), 'times out');
  // Retry waits: from one attempt's end to the next one's start, or to the next run.
  const byPhase = { action: [], compensation: [] };
  for (const a of laneAttempts) byPhase[a.phase].push(a);
  for (const [phase, list] of Object.entries(byPhase)) {
    list.sort((x, y) => x.attempt - y.attempt);
    const what = phase === 'compensation' ? 'undo retry wait' : 'retry wait';
    for (let i = 1; i < list.length; i++) {
      const from = ms(list[i - 1].ended_at);
      const to = ms(list[i].started_at);
      if (from && to > from) {
        track.append(el('div', {
          class: `retrywait ${phase}`, style: `left:${pct(axis, from)};width:${widthPct(axis, from, to)}`,
          title: `${what} ${fmtDur(to - from)}`,
        }));
      }
    }
    const last = list[list.length - 1];
    const phaseRec = phase === 'action' ? rec : rec.compensation;
    if (last && last.ended_at && phaseRec && phaseRec.status === 'RETRYING' && axis.live) {
      const next = ms(rec.retry_at) || ms(saga.next_run_at);
      if (next && next > ms(last.ended_at)) {
        const to = Math.min(next, axis.t1);
        track.append(el('div', {
          class: `retrywait ${phase}`, style: `left:${pct(axis, ms(last.ended_at))};width:${widthPct(axis, ms(last.ended_at), to)}`,
          title: `${phase === 'compensation' ? 'next undo attempt' : 'next attempt'} at ${new Date(next).toISOString()}`,
        }));
        deadline(next, phase === 'compensation' ? 'undo retries' : 'retries');
      }
    }
  }
  if (beyond.length) track.append(el('div', { class: 'beyond' }, beyond));
  for (const a of laneAttempts) track.append(attemptBar(axis, lane, a, view, select));
  if (!laneAttempts.length && !rec.started_at) {
    track.append(el('span', { class: 'lane-note' }, rec.status === 'SKIPPED' ? 'skipped: its condition was false' : 'not started'));
  }
  return track;
}

function laneLabel(lane, laneAttempts, view, onToggle, onLane) {
  const rec = lane.rec;
  const comp = rec.compensation && !['NOT_NEEDED', 'PENDING'].includes(rec.compensation.status)
    ? el('span', { class: `badge s-${rec.compensation.status}`, title: `undo: ${rec.compensation.status}` }, `↩ ${rec.compensation.status}`) : null;
  let toggle = null;
  if (lane.kind === 'parallel') {
    const branches = rec.branches || [];
    const folded = isFolded(view, rec);
    const tally = {};
    for (const b of branches) tally[b.status] = (tally[b.status] || 0) + 1;
    const summary = Object.entries(tally).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(', ');
    toggle = el('button', {
      type: 'button', class: 'toggle', 'aria-expanded': folded ? 'false' : 'true', dataset: { focus: `toggle ${lane.key}` },
      title: summary, 'aria-label': `${folded ? 'Show' : 'Hide'} the ${branches.length} branches of ${lane.key}${summary ? ` (${summary})` : ''}`,
      onclick: () => onToggle(lane.key, !folded),
    }, `${folded ? '▸' : '▾'} ${branches.length}`);
  }
  const retried = ['action', 'compensation'].some((p) => laneAttempts.filter((a) => a.phase === p).length > 1);
  const count = retried ? el('span', { class: 'count-chip', title: `${laneAttempts.length} attempts` }, `${laneAttempts.length}×`) : null;
  const name = el('button', {
    type: 'button', class: 'name', title: `${lane.key} (${lane.kind}): show its attempts`, dataset: { focus: `lane ${lane.key}` },
    onclick: () => onLane(lane.key),
  }, lane.label);
  if (lane.depth) {
    // One line: the branch's name first; its statuses as short badges, spelt out on hover.
    const undo = rec.compensation && !['NOT_NEEDED', 'PENDING'].includes(rec.compensation.status)
      ? el('span', { class: `badge mini s-${rec.compensation.status}`, title: `undo: ${rec.compensation.status}` }, '↩') : null;
    return el('div', { class: 'tl-label branch', role: 'rowheader' },
      el('div', { class: 'line' }, name, count,
        el('span', { class: `badge mini s-${rec.status}`, title: rec.status }, rec.status.slice(0, 4)), undo));
  }
  const kind = ['sleep', 'signal', 'child', 'parallel'].includes(lane.kind) ? el('span', { class: 'kind' }, lane.kind) : null;
  return el('div', { class: 'tl-label', role: 'rowheader' },
    el('div', { class: 'line' }, toggle, name, count),
    el('div', { class: 'line small' }, kind, badge(rec.status), comp));
}

function timelineOf(page, now, withDate) {
  const { saga, attempts } = page;
  const view = viewOf(saga.id);
  const lanes = stepsOf(saga);
  const axis = axisOf(saga, attempts, now);
  const byLane = {};
  for (const a of attempts) (byLane[a.step] || (byLane[a.step] = [])).push(a);
  const rerender = () => drawSaga(page, { timeline: true });
  const select = (key) => { view.selected = key; view.lane = null; rerender(); };
  const onToggle = (key, fold) => { view.folded.set(key, fold); rerender(); };
  const onLane = (key) => { view.lane = key; view.selected = null; rerender(); };
  const rows = [el('div', { class: 'tl-row tl-axis', role: 'row', dataset: { key: ' axis' } },
    el('div', { class: 'tl-label', role: 'columnheader' }, 'Stage'),
    el('div', { class: 'tl-track', role: 'cell' }, ticks(axis, view.zoom, withDate)))];
  for (const lane of lanes) {
    if (lane.depth && isFolded(view, lane.stage)) continue;
    const laneAttempts = byLane[lane.key] || [];
    rows.push(el('div', { class: `tl-row${lane.depth ? ' branch' : ''}`, role: 'row', dataset: { lane: lane.key, status: lane.rec.status, key: `lane ${lane.key}` } },
      laneLabel(lane, laneAttempts, view, onToggle, onLane),
      laneTrack(axis, lane, laneAttempts, saga, view, select, withDate)));
  }
  const grid = el('div', { class: 'tl-grid', role: 'table', 'aria-label': 'Timeline: one lane per stage and branch, one bar per attempt', style: `--zoom:${view.zoom}` }, rows);
  if (axis.live) grid.append(el('div', { class: 'nowline', dataset: { key: ' now' }, style: `left:calc(var(--label-w) + (100% - var(--label-w)) * ${((now - axis.t0) / axis.span).toFixed(4)})`, title: 'now' }));
  const zoomTo = (z) => { view.zoom = z; rerender(); };
  const zi = ZOOMS.indexOf(view.zoom);
  const sample = (cls, mark) => el('span', { class: cls }, mark ? el('span', { class: 'mark' }, mark) : null);
  const toolbar = el('div', { class: 'tl-toolbar' },
    el('div', { role: 'group', 'aria-label': 'Zoom' },
      el('button', { type: 'button', 'aria-label': 'Zoom out', dataset: { focus: 'zoom out' }, disabled: zi <= 0, onclick: () => zoomTo(ZOOMS[zi - 1]) }, '−'), ' ',
      el('button', { type: 'button', dataset: { focus: 'zoom fit' }, onclick: () => zoomTo(1) }, `Fit (${view.zoom}×)`), ' ',
      el('button', { type: 'button', 'aria-label': 'Zoom in', dataset: { focus: 'zoom in' }, disabled: zi >= ZOOMS.length - 1, onclick: () => zoomTo(ZOOMS[zi + 1]) }, '+')),
    el('ul', { class: 'legend', 'aria-label': 'Legend' },
      el('li', {}, sample('bar action ok'), 'action'),
      el('li', {}, sample('bar compensation ok', '↩'), 'compensation'),
      el('li', {}, sample('bar action failed', '✕'), sample('bar compensation failed', '↩✕'), 'failed'),
      el('li', {}, sample('bar action unknown', '?'), sample('bar compensation unknown', '↩?'), 'outcome unknown'),
      el('li', {}, el('span', { class: 'bar waitbar' }), 'sleep or wait'),
      el('li', {}, el('span', { class: 'retrywait action', style: 'position:static;display:inline-block;width:1.6rem' }),
        el('span', { class: 'retrywait compensation', style: 'position:static;display:inline-block;width:1.6rem' }), 'retry wait'),
      el('li', {}, el('span', { class: 'deadline', style: 'position:static;display:inline-block;height:.9rem' }), 'deadline')));
  const details = el('div', { class: 'details', 'aria-live': 'polite', id: 'attempt-details' });
  fillDetails(details, view, attempts, axis, withDate);
  const scrollBox = el('div', { class: 'tl-scroll', tabindex: 0, role: 'region', 'aria-label': 'Timeline, scrollable', dataset: { focus: 'timeline' } }, grid);
  return [el('h2', { id: 't-title' }, 'Timeline'), toolbar, scrollBox, details];
}

function fillDetails(box, view, attempts, axis, withDate) {
  // A running call's length is not counted here: the details are a live region, which would
  // be read out again at every poll.
  const took = (a) => (a.ended_at || !axis.live ? fmtDur((a.ended_at ? ms(a.ended_at) : axis.until) - ms(a.started_at)) : 'still running');
  if (view.selected) {
    const a = attempts.find((x) => `${x.step}|${x.phase}|${x.attempt}` === view.selected);
    if (a) {
      box.append(el('h3', { style: 'margin:.1rem 0 .4rem;font-size:1rem' }, `${a.step}: ${a.phase} attempt ${a.attempt}`),
        el('dl', {},
          el('dt', {}, 'Outcome'), el('dd', {}, a.outcome || (axis.live ? 'running (no result recorded yet)' : 'no result recorded')),
          el('dt', {}, 'Error'), el('dd', {}, a.error || '—'),
          el('dt', {}, 'Started'), el('dd', {}, timeEl(a.started_at)),
          el('dt', {}, 'Ended'), el('dd', {}, timeEl(a.ended_at)),
          el('dt', {}, 'Duration'), el('dd', {}, took(a)),
          el('dt', {}, 'Worker'), el('dd', { class: 'mono' }, `${a.worker} (lease epoch ${a.lease_epoch})`)));
      return;
    }
  }
  if (view.lane) {
    const list = attempts.filter((a) => a.step === view.lane);
    box.append(el('h3', { style: 'margin:.1rem 0 .4rem;font-size:1rem' }, `${view.lane}: ${list.length} attempt${list.length === 1 ? '' : 's'}`),
      list.length ? el('div', {
        class: 'table-wrap', style: 'max-height:20rem;overflow:auto', tabindex: 0, role: 'region',
        'aria-label': `Attempts of ${view.lane}`, dataset: { focus: `attempts ${view.lane}` },
      }, el('table', {},
        el('thead', {}, el('tr', {}, ['Phase', '#', 'Outcome', 'Started', 'Took', 'Worker', 'Error'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, list.map((a) => el('tr', { dataset: { key: `${a.phase}|${a.attempt}` } },
          el('td', {}, a.phase), el('td', {}, a.attempt), el('td', {}, a.outcome || (axis.live ? 'running' : 'no result')),
          el('td', { class: 'nowrap' }, timeEl(a.started_at, true, withDate)),
          el('td', {}, took(a)),
          el('td', { class: 'mono' }, a.worker), el('td', { class: 'err', title: a.error || '' }, a.error || '')))))) : el('p', { class: 'muted' }, 'No call made.'));
    return;
  }
  box.append(el('p', { class: 'muted', style: 'margin:0' },
    `${attempts.length} attempt${attempts.length === 1 ? '' : 's'} in all. Select a bar for its error, worker and duration, or a stage's name for all its attempts.`));
}

// ---- the panels beside the timeline -------------------------------------------------------

function stageRow(r, kind, indent) {
  return el('tr', { dataset: { key: r.name } },
    el('td', { style: indent ? 'padding-left:1.5rem' : '' }, indent ? r.name.split('/').slice(1).join('/') : r.name),
    el('td', {}, kind), el('td', {}, badge(r.status)), el('td', {}, r.attempts),
    el('td', { class: 'err', title: r.last_error || '' }, r.last_error || ''),
    el('td', {}, badge(r.compensation.status)), el('td', {}, r.compensation.attempts),
    el('td', { class: 'err', title: r.compensation.last_error || '' }, r.compensation.last_error || ''));
}

function stagesTable(page, view) {
  const { saga } = page;
  const rows = [];
  for (const stage of saga.stages) {
    rows.push(stageRow(stage, stage.kind === 'step' ? stage.step_kind : stage.kind, false));
    const branches = stage.branches || [];
    if (!branches.length) continue;
    const open = view.tableOpen.has(stage.name) || branches.length <= 8;
    if (open) {
      for (const b of branches) rows.push(stageRow(b, 'branch', true));
    }
    if (branches.length > 8) {
      rows.push(el('tr', { dataset: { key: ` toggle ${stage.name}` } }, el('td', { colspan: 8 }, el('button', {
        type: 'button', 'aria-expanded': open ? 'true' : 'false', dataset: { focus: `stages ${stage.name}` },
        onclick: () => {
          if (open) view.tableOpen.delete(stage.name); else view.tableOpen.add(stage.name);
          drawSaga(page, { panels: true });
        },
      }, open ? `Hide the ${branches.length} branches of ${stage.name}` : `Show the ${branches.length} branches of ${stage.name}`))));
    }
  }
  return el('section', { class: 'wide', dataset: { key: 'stages' } }, el('h2', {}, 'Stages'),
    el('div', { class: 'table-wrap' }, el('table', {},
      el('thead', {}, el('tr', {}, ['Stage', 'Kind', 'Status', 'Attempts', 'Last error', 'Undo', 'Undo attempts', 'Undo error'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', {}, rows))));
}

function panelsOf(page, withDate) {
  const { saga, events, deliveries } = page;
  const view = viewOf(saga.id);
  const outputs = {};
  for (const s of saga.stages) if (s.output !== null && s.output !== undefined) outputs[s.name] = s.output;
  return [
    stagesTable(page, view),
    el('section', { dataset: { key: 'input' } }, el('h2', {}, 'Input'), pretty(saga.input, 'Input')),
    el('section', { dataset: { key: 'output' } }, el('h2', {}, saga.status === 'COMPLETED' ? 'Output' : 'Outputs so far'),
      Object.keys(outputs).length ? pretty(saga.output || outputs, 'Outputs') : el('p', { class: 'muted' }, 'None yet.')),
    el('section', { class: 'wide', dataset: { key: 'events' } }, el('h2', {}, `Events (${events.length})`),
      el('div', { class: 'table-wrap', style: 'max-height:24rem;overflow:auto', tabindex: 0, role: 'region', 'aria-label': 'Events', dataset: { focus: 'events' } }, el('table', {},
        el('thead', {}, el('tr', {}, ['#', 'Time', 'Type', 'Step', 'Details'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, events.map((e) => el('tr', { dataset: { key: String(e.seq) } },
          el('td', {}, e.seq), el('td', { class: 'nowrap' }, timeEl(e.at, true, withDate)), el('td', {}, e.type), el('td', {}, e.step || ''),
          el('td', { class: 'mono', style: 'overflow-wrap:anywhere' }, e.data && Object.keys(e.data).length ? JSON.stringify(e.data) : ''))))))),
    el('section', { class: 'wide', dataset: { key: 'deliveries' } }, el('h2', {}, `Webhook deliveries (${deliveries.length})`),
      deliveries.length ? el('div', { class: 'table-wrap', style: 'max-height:24rem;overflow:auto', tabindex: 0, role: 'region', 'aria-label': 'Webhook deliveries', dataset: { focus: 'deliveries' } }, el('table', {},
        el('thead', {}, el('tr', {}, ['Event', 'Target', 'State', 'Attempts', 'Last answer'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, deliveries.map((d) => el('tr', { dataset: { key: `${d.event_id}|${d.target}` } },
          el('td', {}, `${d.type} #${d.event_id}`), el('td', { class: 'mono', style: 'overflow-wrap:anywhere' }, d.target),
          el('td', {}, d.state, d.state === 'pending' && d.next_attempt_at ? el('span', { class: 'muted' }, ' next ', timeEl(d.next_attempt_at, true, withDate)) : null),
          el('td', {}, d.attempts),
          el('td', { class: 'err', title: d.last_error || '' }, d.last_error || (d.last_status ? `HTTP ${d.last_status}` : '')))))))
        : el('p', { class: 'muted' }, 'No webhook target for this saga.')),
  ];
}
