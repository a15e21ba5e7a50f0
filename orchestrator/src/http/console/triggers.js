// NATS triggers (SPEC §17): the triggers of the process that answers, with their consumer's lag
// and what they started and refused, and the refusals recorded in the log, polled like the list.

import { LIST_POLL_MS, state } from './state.js';
import { api } from './api.js';
import { el, timeEl, fill, main, update } from './ui.js';
import { poll } from './poll.js';

function triggersTable(triggers) {
  return el('div', { class: 'table-wrap', dataset: { key: 'triggers' } }, el('table', { class: 'triggers' },
    el('caption', { class: 'muted', style: 'text-align:left' },
      'The triggers of the process serving this page; the lag is read from its consumer every few seconds.'),
    el('thead', {}, el('tr', {},
      ['Subject', 'Saga', 'Stream', 'Consumer', 'Lag', 'Started', 'Refused'].map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, triggers.map((t) => el('tr', { dataset: { key: t.trigger, trigger: t.trigger } },
      el('th', { scope: 'row', class: 'mono' }, t.subject),
      el('td', { class: 'mono' }, t.saga),
      el('td', { class: 'mono' }, t.stream || '—'),
      el('td', { class: 'mono small' }, t.consumer || '—',
        t.error ? el('div', { class: 'notice small', role: 'status' }, t.error) : null),
      el('td', { class: 'num', dataset: { lag: t.trigger } }, t.lag === null || t.lag === undefined ? '—' : String(t.lag)),
      el('td', { class: 'num' }, String(t.started)),
      el('td', { class: 'num' }, String(t.refused)))))));
}

function refusalsTable(refusals) {
  return el('div', { class: 'table-wrap', dataset: { key: 'refusals' } }, el('table', { class: 'refusals' },
    el('caption', { class: 'muted', style: 'text-align:left' },
      'Messages whose body could not start their saga: terminated on the broker, never redelivered, and kept here.'),
    el('thead', {}, el('tr', {},
      ['Refused', 'Trigger', 'Message', 'Error', 'Body'].map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, refusals.map((r) => el('tr', { dataset: { key: `${r.trigger} ${r.stream}:${r.stream_seq}` } },
      el('td', {}, timeEl(r.refused_at)),
      el('td', { class: 'mono' }, r.trigger),
      el('td', { class: 'mono' }, `${r.stream}:${r.stream_seq}`),
      el('td', {}, r.error),
      el('td', { class: 'mono small' }, r.body_excerpt,
        r.body_bytes > r.body_excerpt.length ? el('span', { class: 'muted' }, ` … (${r.body_bytes} bytes)`) : null))))));
}

/** The triggers page. */
export async function renderTriggers() {
  document.title = 'Triggers';
  const body = el('section', { 'aria-labelledby': 't-title', 'aria-live': 'polite' }, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('p', {}, el('a', { href: '#/' }, '← All sagas')),
    el('h1', { id: 't-title' }, 'Triggers'),
    el('p', { class: 'muted' }, 'Sagas started by NATS JetStream messages (',
      el('span', { class: 'mono' }, 'serve --nats-trigger SUBJECT=SAGA'), '): one saga per message, its body as the input.'),
    body);
  let drawn = null;
  const tick = async (current) => {
    const list = await api('/v1/triggers');
    if (!current()) return false;
    const key = JSON.stringify(list);
    const total = list.refused.reduce((n, c) => n + c.refused, 0);
    if (key !== drawn && update(body, el('div', { dataset: { key: 'triggers-page' } },
      list.triggers.length
        ? triggersTable(list.triggers)
        : el('p', { class: 'muted', dataset: { key: 'none' } }, 'This process runs no trigger.'),
      el('h2', {}, 'Refused messages'),
      total
        ? [el('p', { class: 'muted' }, list.refused.map((c) => `${c.trigger}: ${c.refused}`).join(', ')),
          refusalsTable(list.refusals)]
        : el('p', { class: 'muted', dataset: { key: 'no-refusals' } }, 'None.')))) drawn = key;
    return true;
  };
  await poll(state.generation, tick, LIST_POLL_MS);
}
