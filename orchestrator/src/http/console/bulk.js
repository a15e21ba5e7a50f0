// Bulk jobs: the recent ones, and one job's progress, polled until it is done.

import { BULK_POLL_MS, LIST_POLL_MS, state } from './state.js';
import { api } from './api.js';
import { el, timeEl, badge, shortId, fill, main, update } from './ui.js';
import { poll } from './poll.js';

function sagaLink(id) {
  return el('a', { href: `#/sagas/${id}`, class: 'mono', title: id }, shortId(id));
}

/** One job's page: its action, reason, progress and the sagas it could not act on. */
export async function renderBulk(id) {
  const generation = state.generation;
  document.title = 'Bulk job';
  const body = el('section', { 'aria-live': 'polite' }, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('p', {}, el('a', { href: '#/bulk' }, '← Bulk jobs')), body);
  let drawn = null;
  await poll(generation, async (current) => {
    const job = await api(`/v1/bulk/${id}`);
    if (!current()) return false;
    const key = JSON.stringify(job);
    if (key !== drawn && update(body, [
      el('h1', {}, `Bulk ${job.action}`, badge(job.status)),
      el('dl', { class: 'meta' },
        el('div', {}, el('dt', {}, 'Job'), el('dd', { class: 'mono' }, job.id)),
        el('div', {}, el('dt', {}, 'Sagas'), el('dd', { class: 'mono' }, JSON.stringify(job.filter))),
        el('div', {}, el('dt', {}, 'Reason'), el('dd', {}, job.reason ?? '')),
        el('div', {}, el('dt', {}, 'By'), el('dd', {}, job.actor ?? '')),
        el('div', {}, el('dt', {}, 'Created'), el('dd', {}, timeEl(job.created_at))),
        el('div', { dataset: { key: 'updated' } }, el('dt', {}, job.status === 'DONE' ? 'Done' : 'Updated'), el('dd', {}, timeEl(job.updated_at)))),
      el('p', { dataset: { key: 'progress' } },
        el('label', { for: 'bulk-progress' }, `${job.done} of ${job.matched} sagas handled`), ' ',
        el('progress', { id: 'bulk-progress', max: Math.max(job.matched, 1), value: job.matched ? job.done : 1 })),
      job.refused.length
        ? el('div', { class: 'table-wrap', dataset: { key: 'refused' } }, el('table', {},
          el('caption', { class: 'muted', style: 'text-align:left' }, `Refused: ${job.refused.length} — the action did not apply to these sagas.`),
          el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Saga'), el('th', { scope: 'col' }, 'Code'), el('th', { scope: 'col' }, 'Why'))),
          el('tbody', {}, job.refused.map((r) => el('tr', { dataset: { key: r.saga_id } },
            el('td', {}, sagaLink(r.saga_id)), el('td', { class: 'mono' }, r.code), el('td', {}, r.message))))))
        : el('p', { class: 'muted', dataset: { key: 'refused' } }, 'No saga refused so far.'),
    ])) drawn = key;
    return job.status !== 'DONE';
  }, BULK_POLL_MS, 'the server no longer has this job');
}

/** The recent bulk jobs, newest first. */
export async function renderBulkList() {
  const generation = state.generation;
  document.title = 'Bulk jobs';
  const body = el('section', {}, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('h1', {}, 'Bulk jobs'), el('p', {}, el('a', { href: '#/' }, '← All sagas')), body);
  let drawn = null;
  await poll(generation, async (current) => {
    const page = await api('/v1/bulk?limit=50');
    if (!current()) return false;
    const jobs = page.jobs || [];
    const key = JSON.stringify(jobs);
    if (key !== drawn && update(body, jobs.length
      ? el('div', { class: 'table-wrap', dataset: { key: 'jobs' } }, el('table', {},
        el('caption', { class: 'muted', style: 'text-align:left' }, 'Newest first. Select sagas on the list to start one.'),
        el('thead', {}, el('tr', {}, ['Job', 'Action', 'Status', 'Progress', 'Reason', 'Created'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, jobs.map((j) => el('tr', { dataset: { key: j.id } },
          el('td', {}, el('a', { href: `#/bulk/${j.id}`, class: 'mono' }, shortId(j.id))),
          el('td', {}, j.action), el('td', {}, badge(j.status)),
          el('td', {}, `${j.done} / ${j.matched}`),
          el('td', {}, j.reason ?? ''), el('td', {}, timeEl(j.created_at)))))))
      : el('p', { class: 'muted' }, 'No bulk job yet. Select sagas on the list to start one.'))) drawn = key;
    return true;
  }, LIST_POLL_MS);
}
