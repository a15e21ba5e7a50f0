// Flow control (SPEC §14): every limit with its value, what holds it and what waits for it,
// polled like the list; an operator changes one in a dialog, which shows the server's refusal.

import { LIST_POLL_MS } from './state.js';
import { api, can } from './api.js';
import { el, timeEl, fill, field, main, update } from './ui.js';
import { pollRefreshable } from './poll.js';
import { confirmDialog } from './actions.js';

/** What each kind bounds, in words. */
const KINDS = {
  max_running: 'sagas running at once',
  per_key: 'sagas running at once per key',
  rate: 'calls a step makes (token bucket)',
};

/** A value as the API writes it: `50`, or `20/s, burst 5`. */
function valueText(kind, v) {
  if (kind === 'rate') return v.rate ? `${v.rate}, burst ${v.burst ?? '—'}` : '—';
  return v.limit === null || v.limit === undefined ? '—' : String(v.limit);
}

function what(l) {
  const bounds = KINDS[l.kind] || l.kind;
  if (l.kind === 'per_key') return [bounds, ' of ', el('span', { class: 'mono' }, l.saga), ', key ', el('span', { class: 'mono' }, l.key)];
  if (l.saga) return [bounds, ' of ', el('span', { class: 'mono' }, l.saga)];
  return bounds;
}

/** The dialog that changes `l`: a new limit, or a new rate and burst; the reason is optional. */
function changeDialog(l) {
  const rate = l.kind === 'rate';
  const fields = rate
    ? [
      field('dlg-rate', 'Rate (N/s, N/m or N/h)', el('input', {
        id: 'dlg-rate', name: 'rate', required: true, value: l.rate || '', autocomplete: 'off', spellcheck: 'false',
      })),
      field('dlg-burst', 'Burst (calls let through at once)', el('input', {
        id: 'dlg-burst', name: 'burst', type: 'number', min: 1, required: true, value: l.burst ?? 1,
      })),
    ]
    : [field('dlg-limit', l.kind === 'per_key' ? 'Limit (per key)' : 'Limit', el('input', {
      id: 'dlg-limit', name: 'limit', type: 'number', min: 0, required: true, value: l.limit ?? 0,
    }))];
  confirmDialog({
    title: `Change ${l.name}`,
    text: rate
      ? 'Every step that takes a token from this limiter is spaced at the new rate from now on, in every process within a second; the calls already waiting for a token are spaced anew.'
      : 'Every process applies it within a second: a higher limit starts waiting sagas at once; a lower one holds back the next starts, while the sagas running keep running.',
    fields: [
      ...fields,
      field('dlg-reason', 'Reason (optional; kept with the change, with your token\'s name)',
        el('textarea', { id: 'dlg-reason', name: 'reason', rows: 2 })),
    ],
    submit: 'Change',
    run: async (v) => {
      const body = rate ? { rate: v.rate.trim(), burst: Number(v.burst) } : { limit: Number(v.limit) };
      if (v.reason && v.reason.trim()) body.reason = v.reason;
      const after = await api(`/v1/limits/${encodeURIComponent(l.name)}`, { method: 'PUT', body });
      return `${after.name} is now ${valueText(after.kind, after)}.`;
    },
  });
}

function limitsTable(limits) {
  const operate = can('operate');
  return el('div', { class: 'table-wrap', dataset: { key: 'limits' } }, el('table', { class: 'limits' },
    el('caption', { class: 'muted', style: 'text-align:left' },
      'Kept in the database and shared by every process on it; the declared value is the definition\'s, shown when an operator changed it.'),
    el('thead', {}, el('tr', {},
      ['Limit', 'Bounds', 'Value', 'In use', 'Waiting', 'Changed'].map((h) => el('th', { scope: 'col' }, h)),
      operate ? el('th', { scope: 'col' }, el('span', { class: 'visually-hidden' }, 'Action')) : null)),
    el('tbody', {}, limits.map((l) => {
      const value = valueText(l.kind, l);
      const declared = valueText(l.kind, l.declared || {});
      return el('tr', { dataset: { key: l.name, limit: l.name } },
        el('th', { scope: 'row', class: 'mono' }, l.name),
        el('td', {}, what(l)),
        el('td', { class: 'value' }, el('span', { class: 'mono', dataset: { value: l.name } }, value),
          declared !== value ? el('div', { class: 'muted small' }, `declared: ${declared}`) : null),
        el('td', { class: 'num', title: l.kind === 'rate' ? 'tokens taken and not yet refilled' : 'sagas holding a slot' }, String(l.in_use)),
        el('td', { class: 'num', title: l.kind === 'rate' ? 'steps waiting for a token' : 'sagas waiting to start' }, String(l.waiting)),
        el('td', {}, l.updated_at ? [l.updated_by || '?', ' ', timeEl(l.updated_at)] : el('span', { class: 'muted' }, 'as declared')),
        operate ? el('td', {}, el('button', {
          type: 'button', 'aria-label': `Change ${l.name}…`, dataset: { focus: `change ${l.name}` },
          onclick: () => changeDialog(l),
        }, 'Change…')) : null);
    }))));
}

/** The limits page. */
export async function renderLimits() {
  document.title = 'Limits';
  const body = el('section', { 'aria-labelledby': 'l-title', 'aria-live': 'polite' }, el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('p', {}, el('a', { href: '#/' }, '← All sagas')),
    el('h1', { id: 'l-title' }, 'Limits'),
    el('p', { class: 'muted' }, 'How many sagas of a definition may run at once (in all, or per key of their input), and how fast steps may call a participant. A saga waiting for one says so: ',
      el('span', { class: 'mono' }, 'limit:<name>'), ' or ', el('span', { class: 'mono' }, 'rate:<name>'), '.'),
    body);
  let drawn = null;
  const tick = async (current) => {
    const { limits } = await api('/v1/limits');
    if (!current()) return false;
    const key = JSON.stringify([limits, can('operate')]);
    if (key !== drawn && update(body, limits.length
      ? limitsTable(limits)
      : el('p', { class: 'muted', dataset: { key: 'none' } }, 'No limit: no definition on this database declares one.'))) drawn = key;
    return true;
  };
  // After a change: read the limits again now.
  await pollRefreshable(tick, LIST_POLL_MS);
}
