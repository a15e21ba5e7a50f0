// Schedules (SPEC §17): every schedule with its next runs and its latest run, and one
// schedule's page with its recent runs (what happened to each tick, linked to its saga). An
// operator pauses, resumes, fires or deletes one in a dialog that shows the server's refusal.
// Both pages are polled like the list.

import { LIST_POLL_MS } from './state.js';
import { api, can } from './api.js';
import { el, timeEl, fill, main, update, shortId } from './ui.js';
import { pollRefreshable } from './poll.js';
import { confirmDialog } from './actions.js';

/** What happened to a tick, in words. */
const OUTCOMES = {
  started: 'started',
  skipped: 'skipped (previous run not ended)',
  buffered: 'buffered (waits for the previous run)',
  cancelled_other: 'started, cancelling the previous run',
  missed: 'missed (beyond the catch-up window)',
  failed: 'failed to start',
};

/** `cron 0 2 * * * (Europe/Paris)`, or `every 15m`. */
function cadence(s) {
  if (s.cron) return [el('span', { class: 'mono' }, s.cron), ` (${s.timezone})`];
  return ['every ', el('span', { class: 'mono' }, s.every)];
}

const path = (id, action = '') => `/v1/schedules/${encodeURIComponent(id)}${action}`;

function sagaLink(id) {
  return id ? el('a', { href: `#/sagas/${id}`, class: 'mono', title: id }, shortId(id)) : el('span', { class: 'muted' }, '—');
}

/** The operator's buttons for schedule `s`. */
function actionButtons(s) {
  if (!can('operate')) return null;
  const button = (label, dialog) => el('button', {
    type: 'button', 'aria-label': `${label} ${s.id}…`, dataset: { focus: `${label} ${s.id}` }, onclick: dialog,
  }, `${label}…`);
  return el('span', { class: 'buttons' },
    s.paused
      ? button('Resume', () => confirmDialog({
        title: `Resume ${s.id}`,
        text: 'It fires again from its next tick after now; the ticks while it was paused are not caught up.',
        submit: 'Resume',
        run: async () => {
          const after = await api(path(s.id, '/resume'), { method: 'POST' });
          return `${after.id} resumed; next run ${after.next_runs[0] || '—'}.`;
        },
      }))
      : button('Pause', () => confirmDialog({
        title: `Pause ${s.id}`,
        text: 'No tick fires until it is resumed; the sagas it started keep running.',
        submit: 'Pause',
        run: async () => {
          await api(path(s.id, '/pause'), { method: 'POST' });
          return `${s.id} paused.`;
        },
      })),
    ' ',
    button('Trigger', () => confirmDialog({
      title: `Fire ${s.id} now`,
      text: `A tick at this instant, under its overlap policy (${s.overlap}); its next tick does not move.`,
      submit: 'Fire now',
      run: async () => {
        const run = await api(path(s.id, '/trigger'), { method: 'POST' });
        return `${s.id}: ${OUTCOMES[run.outcome] || run.outcome}${run.saga_id ? `, saga ${run.saga_id}` : ''}.`;
      },
    })),
    ' ',
    button('Delete', () => confirmDialog({
      title: `Delete ${s.id}`,
      text: 'The schedule and its history are deleted; the sagas it started keep running.',
      submit: 'Delete',
      danger: true,
      run: async () => {
        await api(path(s.id), { method: 'DELETE' });
        if (location.hash !== '#/schedules') location.hash = '#/schedules';
        return `${s.id} deleted.`;
      },
    })));
}

function runsCell(r) {
  if (!r) return el('span', { class: 'muted' }, 'no run yet');
  return [el('span', { dataset: { outcome: r.outcome } }, OUTCOMES[r.outcome] || r.outcome), ' ', timeEl(r.scheduled_at, true), ' ', sagaLink(r.saga_id)];
}

function schedulesTable(schedules) {
  return el('div', { class: 'table-wrap', dataset: { key: 'schedules' } }, el('table', { class: 'schedules' },
    el('thead', {}, el('tr', {},
      ['Schedule', 'Saga', 'When', 'Overlap', 'Next runs', 'Latest run'].map((h) => el('th', { scope: 'col' }, h)),
      can('operate') ? el('th', { scope: 'col' }, el('span', { class: 'visually-hidden' }, 'Actions')) : null)),
    el('tbody', {}, schedules.map((s) => el('tr', { dataset: { key: s.id, schedule: s.id } },
      el('th', { scope: 'row' }, el('a', { href: `#/schedules/${encodeURIComponent(s.id)}`, class: 'mono' }, s.id)),
      el('td', { class: 'mono' }, s.saga),
      el('td', {}, cadence(s)),
      el('td', {}, s.overlap),
      el('td', { dataset: { next: s.id } }, s.paused
        ? el('span', { class: 'muted' }, 'paused')
        : s.next_runs.slice(0, 3).map((t) => el('div', {}, timeEl(t, true, true)))),
      el('td', {}, runsCell(s.runs[0])),
      can('operate') ? el('td', {}, actionButtons(s)) : null)))));
}

/** The schedules page. */
export async function renderSchedules() {
  document.title = 'Schedules';
  const body = el('section', { 'aria-labelledby': 's-title', 'aria-live': 'polite' }, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('p', {}, el('a', { href: '#/' }, '← All sagas')),
    el('h1', { id: 's-title' }, 'Schedules'),
    el('p', { class: 'muted' }, 'Sagas started on a cron expression or at an interval, one saga per tick across every process.'),
    body);
  let drawn = null;
  const tick = async (current) => {
    const { schedules } = await api('/v1/schedules');
    if (!current()) return false;
    const key = JSON.stringify([schedules, can('operate')]);
    if (key !== drawn && update(body, schedules.length
      ? schedulesTable(schedules)
      : el('p', { class: 'muted', dataset: { key: 'none' } }, 'No schedule yet: make one with POST /v1/schedules or `saga schedule create`.'))) drawn = key;
    return true;
  };
  await pollRefreshable(tick, LIST_POLL_MS);
}

function scheduleBody(s) {
  const fact = (name, ...value) => [el('dt', {}, name), el('dd', {}, ...value)];
  return el('div', { dataset: { key: `schedule ${s.id}` } },
    el('dl', { class: 'facts' },
      fact('Saga', el('span', { class: 'mono' }, s.saga)),
      fact('When', cadence(s)),
      fact('Overlap', s.overlap),
      fact('Catch-up window', s.catchup_window),
      fact('State', s.paused ? 'paused' : 'active'),
      s.buffered_at ? fact('Buffered tick', timeEl(s.buffered_at)) : null,
      fact('Input', el('code', {}, JSON.stringify(s.input)))),
    actionButtons(s),
    el('h2', {}, 'Next runs'),
    s.next_runs.length
      ? el('ol', { class: 'next-runs' }, s.next_runs.map((t) => el('li', {}, timeEl(t, false, true))))
      : el('p', { class: 'muted' }, 'None while paused.'),
    el('h2', {}, 'Latest runs'),
    s.runs.length
      ? el('div', { class: 'table-wrap' }, el('table', { class: 'runs' },
        el('thead', {}, el('tr', {}, ['Tick', 'What happened', 'Saga', 'Detail'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, s.runs.map((r) => el('tr', { dataset: { tick: r.scheduled_at } },
          el('td', {}, timeEl(r.scheduled_at, false, true), r.triggered ? el('span', { class: 'muted' }, ' (trigger)') : null),
          el('td', { dataset: { outcome: r.outcome } }, OUTCOMES[r.outcome] || r.outcome),
          el('td', {}, sagaLink(r.saga_id)),
          el('td', { class: 'muted' }, r.detail || ''))))))
      : el('p', { class: 'muted' }, 'No run yet.'));
}

/** One schedule's page. */
export async function renderSchedule(id) {
  document.title = `Schedule ${id}`;
  const body = el('section', { 'aria-labelledby': 'sc-title', 'aria-live': 'polite' }, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('p', {}, el('a', { href: '#/schedules' }, '← All schedules')),
    el('h1', { id: 'sc-title' }, 'Schedule ', el('span', { class: 'mono' }, id)),
    body);
  let drawn = null;
  const tick = async (current) => {
    const s = await api(path(id));
    if (!current()) return false;
    const key = JSON.stringify([s, can('operate')]);
    if (key !== drawn && update(body, scheduleBody(s))) drawn = key;
    return true;
  };
  await pollRefreshable(tick, LIST_POLL_MS);
}
