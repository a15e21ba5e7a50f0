// The list of sagas, its filters and the queue of those needing attention.

import { STATUSES, LIST_POLL_MS, BULK_ACTIONS, state } from './state.js';
import { ApiError, describe, api, can } from './api.js';
import { el, timeEl, badge, idText, fill, field, main, update, showCounts, waitEl } from './ui.js';
import { showLogin } from './login.js';
import { poll } from './poll.js';
import { bulkDialog } from './actions.js';

// ---- the list of sagas --------------------------------------------------------------------

function toLocalInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/**
 * The search attributes of the filter `attr` (`user=ada, order_id=o-991`) as [name, value]
 * pairs; a piece without `=` is kept whole as a name, for the API to refuse.
 */
function attrPairs(text) {
  return (text || '').split(',').map((p) => p.trim()).filter((p) => p).map((p) => {
    const at = p.indexOf('=');
    return at < 0 ? [p, ''] : [p.slice(0, at).trim(), p.slice(at + 1).trim()];
  });
}

/** A saga's search attributes as `name=value` pieces. */
function attrsText(attrs) {
  return Object.entries(attrs || {}).map(([k, v]) => `${k}=${v}`).join(', ');
}

function listQuery(params) {
  const q = new URLSearchParams();
  for (const [k, v] of attrPairs(params.get('attr'))) q.append(`attr.${k}`, v);
  if (params.get('status')) q.set('status', params.get('status'));
  if (params.get('name')) q.set('name', params.get('name'));
  if (params.get('needs_attention')) q.set('needs_attention', 'true');
  if (params.get('blocked')) q.set('blocked', 'true');
  if (params.get('after')) q.set('created_after', params.get('after'));
  if (params.get('before')) q.set('created_before', params.get('before'));
  if (params.get('id')) q.set('id_prefix', params.get('id'));
  q.set('limit', '50');
  return q;
}

/** A row; with `picks` (the ids selected for a bulk action), a checkbox to select it. */
function sagaRow(s, picks) {
  return el('tr', { class: s.needs_attention ? 'attention' : '', dataset: { key: s.id } },
    picks ? el('td', { class: 'pick' }, el('input', {
      type: 'checkbox', class: 'pick', 'aria-label': `Select ${s.id}`, checked: picks.has(s.id),
      dataset: { id: s.id, focus: `pick ${s.id}` },
      onchange: (ev) => picks.toggle(s.id, ev.target.checked),
    })) : null,
    el('td', { class: 'idcell' }, el('a', { href: `#/sagas/${s.id}`, class: 'mono' }, idText(s.id))),
    el('td', {}, s.name),
    el('td', {}, badge(s.status), ' ',
      s.needs_attention ? el('span', { class: 'badge flagbadge' }, 'needs attention') : null, ' ',
      s.blocked ? el('span', { class: 'badge flagbadge' }, 'blocked') : null),
    el('td', { class: 'waiting' }, waitEl(s)),
    el('td', { class: 'opt attrs', title: attrsText(s.attrs) }, attrsText(s.attrs)),
    el('td', { class: 'opt' }, timeEl(s.created_at)),
    el('td', { class: 'opt' }, timeEl(s.updated_at)),
    el('td', { class: 'err', title: s.error || '' }, s.error || ''));
}

function sagaTable(sagas, caption, name, picks) {
  const all = picks && sagas.length > 0 && sagas.every((s) => picks.has(s.id));
  return el('div', { class: 'table-wrap', dataset: { key: name } }, el('table', {},
    el('caption', { class: 'muted', style: 'text-align:left' }, caption),
    el('thead', {}, el('tr', {},
      picks ? el('th', { scope: 'col', class: 'pick' }, el('input', {
        type: 'checkbox', class: 'pick-all', 'aria-label': 'Select every saga on this page', checked: all,
        dataset: { focus: 'pick all' },
        onchange: (ev) => picks.page(sagas.map((s) => s.id), ev.target.checked),
      })) : null,
      el('th', { scope: 'col' }, 'Id'), el('th', { scope: 'col' }, 'Saga'), el('th', { scope: 'col' }, 'Status'),
      el('th', { scope: 'col' }, 'Waiting for'),
      el('th', { scope: 'col', class: 'opt' }, 'Attributes'),
      el('th', { scope: 'col', class: 'opt' }, 'Created'), el('th', { scope: 'col', class: 'opt' }, 'Updated'),
      el('th', { scope: 'col' }, 'Error'))),
    el('tbody', {}, sagas.map((s) => sagaRow(s, picks)))));
}

/**
 * The list's filter as a bulk action's filter (POST /v1/bulk), or null when it filters on
 * something a bulk filter has not (blocked, an id prefix).
 */
function bulkFilter(params) {
  if (params.get('blocked') || params.get('id')) return null;
  const f = {};
  if (params.get('status')) f.status = params.get('status');
  if (params.get('name')) f.name = params.get('name');
  if (params.get('needs_attention')) f.needs_attention = true;
  if (params.get('after')) f.created_after = params.get('after');
  if (params.get('before')) f.created_before = params.get('before');
  const attrs = attrPairs(params.get('attr'));
  if (attrs.length) f.attr = Object.fromEntries(attrs);
  return f;
}

/**
 * The sagas picked for a bulk action, kept across pages and refreshes of the list, and the bar
 * that acts on them (or on every saga the filter matches). `redraw` draws the bar again.
 */
function picker(bar, currentParams) {
  const ids = new Set();
  const count = el('span', { id: 'bulk-count', role: 'status' });
  const action = el('select', { id: 'bulk-action', name: 'action' },
    BULK_ACTIONS.map((a) => el('option', { value: a }, a)));
  const onSelected = el('button', {
    type: 'button',
    onclick: () => bulkDialog({ action: action.value, filter: { ids: [...ids] }, what: `the ${ids.size} selected saga${ids.size === 1 ? '' : 's'}` }),
  }, 'Act on selected…');
  const onMatching = el('button', {
    type: 'button',
    onclick: () => bulkDialog({ action: action.value, filter: bulkFilter(currentParams()), what: 'every saga matching these filters' }),
  }, 'Act on all matching…');
  const clear = el('button', { type: 'button', onclick: () => { ids.clear(); picks.draw(); } }, 'Clear selection');
  fill(bar, count, field('bulk-action', 'Action', action), onSelected, onMatching, clear, el('a', { href: '#/bulk' }, 'Bulk jobs'));
  const picks = {
    has: (id) => ids.has(id),
    toggle: (id, on) => { if (on) ids.add(id); else ids.delete(id); picks.draw(); },
    page: (list, on) => { for (const id of list) { if (on) ids.add(id); else ids.delete(id); } picks.draw(); },
    /** Sets each checkbox from the selection: a patched page keeps the boxes of its last draw. */
    sync: (region) => {
      const boxes = [...region.querySelectorAll('input.pick')];
      for (const box of boxes) box.checked = ids.has(box.dataset.id);
      const all = region.querySelector('input.pick-all');
      if (all) all.checked = boxes.length > 0 && boxes.every((b) => b.checked);
    },
    /** Brings the bar up to date with the selection and the filter shown (the same nodes stay). */
    draw: () => {
      picks.sync(document);
      const text = ids.size ? `${ids.size} selected` : 'Select sagas to act on them together';
      if (count.textContent !== text) count.textContent = text;
      // Each property is set only when it changes: a refresh that changes nothing draws nothing.
      const set = (node, key, value) => { if (node[key] !== value) node[key] = value; };
      set(onSelected, 'disabled', ids.size === 0);
      set(clear, 'hidden', ids.size === 0);
      const filter = bulkFilter(currentParams());
      set(onMatching, 'disabled', !filter || Object.keys(filter).length === 0);
      set(onMatching, 'title', onMatching.disabled
        ? 'Set a filter first (status, saga, needs attention, dates, attributes); blocked and id prefix are not bulk filters' : '');
    },
  };
  return picks;
}

/** The API's complaint about a filter, shown beside the field it is about. */
const FILTER_PARAMS = [['attr.', 'f-attr'], ['id_prefix', 'f-id'], ['created_after', 'f-after'], ['created_before', 'f-before'], ['status', 'f-status'], ['name', 'f-name']];

export async function renderList(params) {
  const generation = state.generation;
  document.title = 'Sagas';
  if (!state.definitions) {
    try {
      state.definitions = (await api('/v1/definitions')).definitions;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) throw e;
      state.definitions = []; // the names of the sagas listed are offered instead
    }
  }
  if (generation !== state.generation) return;
  for (const d of state.definitions) state.names.add(d.name);

  const status = el('select', { id: 'f-status', name: 'status' },
    el('option', { value: '' }, 'any'),
    STATUSES.map((s) => el('option', { value: s, selected: params.get('status') === s }, s)));
  // Free text: sagas of a definition no running process has are listed too. Exact, as the API matches.
  const names = el('datalist', { id: 'f-names' });
  const name = el('input', {
    id: 'f-name', name: 'name', type: 'text', list: 'f-names', value: params.get('name') || '',
    autocomplete: 'off', spellcheck: 'false', size: 16, placeholder: 'exact name',
  });
  const attention = el('input', { id: 'f-attention', type: 'checkbox', checked: !!params.get('needs_attention') });
  const blocked = el('input', { id: 'f-blocked', type: 'checkbox', checked: !!params.get('blocked') });
  const after = el('input', { id: 'f-after', type: 'datetime-local', value: toLocalInput(params.get('after')) });
  const before = el('input', { id: 'f-before', type: 'datetime-local', value: toLocalInput(params.get('before')) });
  const idPrefix = el('input', {
    id: 'f-id', type: 'search', value: params.get('id') || '', placeholder: '8+ hex digits', size: 14,
    autocomplete: 'off', spellcheck: 'false',
  });
  const attrs = el('input', {
    id: 'f-attr', type: 'search', value: params.get('attr') || '', placeholder: 'user=ada', size: 16,
    autocomplete: 'off', spellcheck: 'false',
  });
  const problems = {};
  for (const [, id] of FILTER_PARAMS) problems[id] = el('p', { class: 'field-error', id: `${id}-error`, hidden: true });
  const formProblem = el('p', { class: 'field-error', hidden: true });
  const showNames = () => {
    const known = [...state.names].sort();
    if (names.childElementCount !== known.length) fill(names, known.map((n) => el('option', { value: n })));
  };
  showNames();

  const fromForm = () => {
    const q = new URLSearchParams();
    if (status.value) q.set('status', status.value);
    if (name.value.trim()) q.set('name', name.value.trim());
    if (attention.checked) q.set('needs_attention', '1');
    if (blocked.checked) q.set('blocked', '1');
    if (after.value) q.set('after', new Date(after.value).toISOString());
    if (before.value) q.set('before', new Date(before.value).toISOString());
    if (idPrefix.value.trim()) q.set('id', idPrefix.value.trim());
    if (attrs.value.trim()) q.set('attr', attrs.value.trim());
    return q;
  };
  // A filter applied stays in the URL (a link shares the view) but is not a navigation: the
  // form stays as it is and the focus where it is, only the results change.
  let shown = params;
  const show = (q) => {
    if (q.toString() === shown.toString()) return;
    shown = q;
    history.pushState(null, '', q.toString() ? `#/?${q}` : '#/');
    state.generation += 1;
    load(q).catch((e) => {
      if (e instanceof ApiError && e.status === 401) showLogin('The token was refused.');
    });
  };
  const apply = () => show(fromForm());
  const form = el('form', {
    class: 'filters', role: 'search', 'aria-label': 'Filter sagas',
    onsubmit: (ev) => { ev.preventDefault(); apply(); },
  },
  field('f-status', 'Status', status, problems['f-status']),
  field('f-name', 'Saga', name, names, problems['f-name']),
  el('label', { class: 'check', for: 'f-attention' }, attention, 'Needs attention'),
  el('label', { class: 'check', for: 'f-blocked' }, blocked, 'Blocked'),
  field('f-after', 'Created from', after, problems['f-after']),
  field('f-before', 'Created before', before, problems['f-before']),
  field('f-id', 'Id starts with', idPrefix, problems['f-id']),
  field('f-attr', 'Attributes', attrs, problems['f-attr']),
  el('div', { class: 'actions' },
    el('button', { type: 'submit', class: 'primary' }, 'Filter'),
    el('button', {
      type: 'button',
      onclick: () => {
        for (const c of [status, name, after, before, idPrefix, attrs]) c.value = '';
        attention.checked = false;
        blocked.checked = false;
        apply();
      },
    }, 'Clear')),
  formProblem);
  // Choices apply at once; typed values once complete: on Enter, on leaving the field, or
  // with the Filter button.
  for (const input of [status, attention, blocked]) input.addEventListener('change', apply);
  for (const input of [name, after, before, idPrefix, attrs]) input.addEventListener('blur', apply);
  name.addEventListener('input', (ev) => {
    // A name picked from the suggestions is complete.
    if (ev.inputType === 'insertReplacementText' || (!ev.inputType && state.names.has(name.value))) apply();
  });

  const queue = el('section', { class: 'attention-queue', 'aria-labelledby': 'q-title', hidden: true });
  // Bulk actions need the operate scope; a reader's list has no checkboxes.
  const bar = el('div', { class: 'bulkbar', role: 'group', 'aria-label': 'Bulk actions' });
  const picks = can('operate') ? picker(bar, () => shown) : null;
  const results = el('section', { 'aria-labelledby': 'r-title' },
    el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('h1', {}, 'Sagas'), queue, form, picks ? bar : null, results);
  if (picks) picks.draw();

  let problemShown = false;
  const showProblem = (e) => {
    if (!e && !problemShown) return; // nothing to take away: the page is left untouched
    problemShown = !!e;
    const message = e ? describe(e) : '';
    const at = e ? FILTER_PARAMS.find(([p]) => e.message.includes(p)) : null;
    const target = at ? problems[at[1]] : formProblem;
    for (const [, id] of FILTER_PARAMS) {
      const control = document.getElementById(id);
      const mine = e && problems[id] === target;
      problems[id].hidden = !mine;
      problems[id].textContent = mine ? message : '';
      if (mine) {
        control.setAttribute('aria-invalid', 'true');
        control.setAttribute('aria-describedby', `${id}-error`);
      } else {
        control.removeAttribute('aria-invalid');
        control.removeAttribute('aria-describedby');
      }
    }
    formProblem.hidden = !e || target !== formProblem;
    formProblem.textContent = e && target === formProblem ? message : '';
  };

  let drawn = {};
  const load = (p) => {
    const loadGeneration = state.generation;
    const filterKey = listQuery(p).toString();
    const cursors = state.listCursors[filterKey] || (state.listCursors[filterKey] = []);
    const cursor = p.get('cursor');
    const filtering = [...p.keys()].some((k) => k !== 'cursor');
    let loaded = false;
    results.setAttribute('aria-busy', 'true');
    const page = (q2) => el('div', { class: 'pager', dataset: { key: 'pager' } },
      el('button', {
        type: 'button', disabled: !cursor, dataset: { focus: 'newer' },
        onclick: () => {
          const previous = cursors.pop();
          const next = new URLSearchParams(p);
          if (previous) next.set('cursor', previous); else next.delete('cursor');
          show(next);
        },
      }, '← Newer'),
      el('button', {
        type: 'button', disabled: !q2.next_cursor, dataset: { focus: 'older' },
        onclick: () => {
          cursors.push(cursor || '');
          const next = new URLSearchParams(p);
          next.set('cursor', q2.next_cursor);
          show(next);
        },
      }, 'Older →'));
    return poll(loadGeneration, async (current) => {
      const q = listQuery(p);
      if (cursor) q.set('cursor', cursor);
      let found;
      let attentionPage;
      let counts;
      try {
        [found, attentionPage, counts] = await Promise.all([
          api(`/v1/sagas?${q}`),
          filtering ? null : api('/v1/sagas?needs_attention=true&limit=10'),
          api('/v1/counts'),
        ]);
      } catch (e) {
        if (!current() || !(e instanceof ApiError)) throw e;
        if (e.status === 400) {
          // The form is left as it is, with the field in question marked.
          showProblem(e);
          results.removeAttribute('aria-busy');
          update(results, [el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'muted' }, 'No result: a filter is not valid.')]);
          drawn = {};
          return false;
        }
        if (!loaded && e.status !== 401) {
          results.removeAttribute('aria-busy');
          update(results, [el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'notice', role: 'alert' }, `Could not load the sagas: ${describe(e)}`)]);
          drawn = {};
          return true; // tried again at the next poll
        }
        throw e;
      }
      if (!current()) return false;
      loaded = true;
      showProblem(null);
      showCounts(counts, p.get('status'));
      for (const s of [...found.sagas, ...(attentionPage ? attentionPage.sagas : [])]) state.names.add(s.name);
      showNames();
      const queueKey = JSON.stringify(attentionPage);
      if (queueKey !== drawn.queue) {
        if (attentionPage && attentionPage.sagas.length) {
          queue.hidden = false;
          if (update(queue, [
            el('h2', { id: 'q-title' }, `Needs attention first (${attentionPage.sagas.length}${attentionPage.next_cursor ? '+' : ''})`),
            sagaTable(attentionPage.sagas, 'Compensations that keep failing, failed sagas: each waits for a person.', 'queue'),
            attentionPage.next_cursor ? el('a', { href: '#/?needs_attention=1' }, 'All sagas needing attention') : null,
          ])) drawn.queue = queueKey;
        } else {
          queue.hidden = true;
          queue.replaceChildren();
          drawn.queue = queueKey;
        }
      }
      const resultsKey = JSON.stringify([found, cursor]);
      if (resultsKey !== drawn.results && update(results, [
        el('h2', { id: 'r-title' }, 'Sagas'),
        found.sagas.length
          ? sagaTable(found.sagas, 'Newest first. Times in your time zone; hover for UTC.', 'results', picks)
          : el('p', { class: 'muted' }, 'No saga matches these filters.'),
        page(found),
      ])) drawn.results = resultsKey;
      if (picks) picks.draw();
      results.removeAttribute('aria-busy');
      return true;
    }, LIST_POLL_MS);
  };
  await load(params);
}
