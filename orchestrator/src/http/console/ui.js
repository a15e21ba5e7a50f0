// Building and patching the page: elements, times, drawing again without losing one's place,
// the notice that the page is behind, and the counts in the header.

import { STATUSES, state } from './state.js';
import { serverWasAt, serverNow } from './api.js';

// ---- small helpers ------------------------------------------------------------------------

/**
 * Builds an element: `el('a', {href: '#'}, 'text', child)`. Text is always text, never HTML.
 * Handlers are set as properties (`onclick`), so that a patch can hand them on (see morph).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'style') node.style.cssText = v; // through the CSSOM: allowed by the CSP
    else if (k.startsWith('on')) node[k] = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (v === true) node.setAttribute(k, '');
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// ---- times --------------------------------------------------------------------------------

export const localFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
const timeOnly = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
const dayAndTime = new Intl.DateTimeFormat(undefined, {
  month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit',
});

export function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

export function dayOf(t) {
  const d = new Date(t);
  return `${d.getFullYear()}-${d.getMonth()}-${d.getDate()}`;
}

/** Whether times between `from` and `to` need their date: they span days, or are not today's. */
export function needsDate(from, to) {
  return dayOf(from) !== dayOf(to) || dayOf(to) !== dayOf(serverNow());
}

/** A clock time, with its date if `withDate`. */
export function clockText(t, withDate) {
  return (withDate ? dayAndTime : timeOnly).format(new Date(t));
}

/** A time in the viewer's zone, UTC on hover; `short` leaves out the date unless `withDate`. */
export function timeEl(iso, short = false, withDate = false) {
  if (!iso) return el('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  const text = short ? clockText(d, withDate) : localFormat.format(d);
  return el('time', { datetime: iso, title: `UTC: ${d.toISOString()}` }, text);
}

export function fmtDur(milliseconds) {
  if (milliseconds === null || milliseconds === undefined || Number.isNaN(milliseconds)) return '—';
  const m = Math.max(0, milliseconds);
  if (m < 1000) return `${Math.round(m)} ms`;
  if (m < 60_000) return `${(m / 1000).toFixed(m < 10_000 ? 2 : 1)} s`;
  const s = Math.round(m / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86_400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86_400)} d ${Math.floor((s % 86_400) / 3600)} h`;
}

export function badge(status, prefix = '') {
  return el('span', { class: `badge s-${status}` }, prefix + status);
}

/**
 * A short form of an id. Ids are UUIDv7: their first digits are their creation time, the
 * same for sagas started together, so the last ones (random) are kept too.
 */
// What a parked saga waits for, in the server's words (`waiting_for`, `wake_at`), or null. A
// limit or a rate limiter's name leads to the limits page, which says what holds it.
export function waitEl(s) {
  if (!s.waiting_for) return null;
  const flow = s.waiting_for.match(/^(limit|rate):(.+)$/);
  const words = flow
    ? [`${flow[1]}:`, el('a', { href: '#/limits', title: `The limits: ${flow[2]}'s value and what holds it` }, flow[2])]
    : s.waiting_for;
  return el('span', { class: 'wait', dataset: { wait: s.waiting_for } }, words,
    s.wake_at ? [' until ', timeEl(s.wake_at)] : null);
}

export function shortId(id) {
  return id ? `${id.slice(0, 8)}…${id.slice(-4)}` : '';
}

/** A whole id that a narrow screen shortens as `shortId` does, keeping it whole for reading. */
export function idText(id) {
  return [
    el('span', {}, id.slice(0, 8)),
    el('span', { class: 'id-mid' }, id.slice(8, -4)),
    el('span', { class: 'id-ell', 'aria-hidden': 'true' }, '…'),
    el('span', {}, id.slice(-4)),
  ];
}

export function toast(message) {
  const box = document.getElementById('toast');
  const item = el('div', {}, message);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

/** Replaces `node`'s children with the given ones, leaving out the absent (null, false). */
export function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

/** A labelled form field: the label beside its control, not around it. */
export function field(id, label, control, ...more) {
  return el('div', { class: 'field' }, el('label', { for: id }, label), control, ...more);
}

export function pretty(value, name) {
  return el('pre', { class: 'json', tabindex: 0, role: 'region', 'aria-label': name, dataset: { focus: `json ${name}` } },
    JSON.stringify(value, null, 2));
}

export function main() {
  return document.getElementById('main');
}

// ---- drawing again without losing one's place -----------------------------------------------

/** What pairs a node with its next version: its data-key, else its data-focus. */
function keyOf(node) {
  if (node.nodeType !== 1) return null;
  return node.dataset.key ?? node.dataset.focus ?? null;
}

const HANDLERS = ['onclick', 'onchange', 'oninput', 'onsubmit', 'onkeydown'];

/** Makes `old` like `fresh`, keeping every node that stands for the same thing in both. */
function morph(old, fresh) {
  for (const { name } of [...old.attributes]) {
    if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  }
  for (const { name, value } of fresh.attributes) {
    if (name === 'style') {
      if (old.style.cssText !== fresh.style.cssText) old.style.cssText = fresh.style.cssText; // CSSOM, as el() does
    } else if (old.getAttribute(name) !== value) {
      old.setAttribute(name, value);
    }
  }
  for (const h of HANDLERS) if (old[h] !== fresh[h]) old[h] = fresh[h];
  morphChildren(old, fresh);
}

function morphChildren(parent, fresh) {
  const keyed = new Map();
  for (const c of parent.childNodes) {
    const k = keyOf(c);
    if (k !== null) keyed.set(k, c);
  }
  let cursor = parent.firstChild;
  for (const next of [...fresh.childNodes]) {
    const k = keyOf(next);
    let match = null;
    if (k !== null) {
      const found = keyed.get(k);
      if (found && found.nodeName === next.nodeName) {
        match = found;
        keyed.delete(k);
      }
    } else if (cursor && keyOf(cursor) === null && cursor.nodeName === next.nodeName) {
      match = cursor;
    }
    if (!match) {
      parent.insertBefore(next, cursor);
      continue;
    }
    if (match === cursor) cursor = cursor.nextSibling;
    // moveBefore keeps a moved node's focus; insertBefore (older browsers) does not.
    else if (parent.moveBefore) parent.moveBefore(match, cursor);
    else parent.insertBefore(match, cursor);
    if (match.nodeType === 1) morph(match, next);
    else if (match.nodeValue !== next.nodeValue) match.nodeValue = next.nodeValue;
  }
  while (cursor) {
    const after = cursor.nextSibling;
    cursor.remove();
    cursor = after;
  }
}

/** Whether the user has text selected in `region` (a redraw would take it away). */
function selecting(region) {
  const selection = document.getSelection();
  if (!selection || selection.isCollapsed) return false;
  for (let i = 0; i < selection.rangeCount; i++) {
    if (selection.getRangeAt(i).intersectsNode(region)) return true;
  }
  return false;
}

/** A name for a focusable node that its next version shares. */
function focusKey(node) {
  if (node.dataset && node.dataset.focus) return `f ${node.dataset.focus}`;
  if (node.id) return `#${node.id}`;
  if (node.getAttribute('href')) return `href ${node.getAttribute('href')}`;
  return `${node.tagName} ${node.getAttribute('aria-label') || node.textContent.trim()}`;
}

/**
 * Draws `children` into `region` as a patch of what it shows. Not while the user selects text
 * there (answers false: the caller tries again at its next poll) unless `force`. Focus that
 * was in the region and lost with a node goes to the node's new version, if any.
 */
export function update(region, children, force = false) {
  if (!force && selecting(region)) return false;
  const active = document.activeElement;
  const had = active && active !== region && region.contains(active) ? focusKey(active) : null;
  morphChildren(region, el('div', {}, children));
  if (had && !region.contains(document.activeElement)) {
    const again = [...region.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
      .find((n) => focusKey(n) === had);
    if (again) again.focus({ preventScroll: true });
    else if (document.activeElement === document.body) main().focus({ preventScroll: true });
  }
  return true;
}

// ---- when the page is behind ----------------------------------------------------------------

/** Says, politely, that the page shows older data than it should; `null` says all is well. */
export function refreshNotice(problem, shownAt) {
  const box = document.getElementById('refresh');
  const text = problem
    ? `${problem}${shownAt ? `; showing the data from ${timeOnly.format(new Date(shownAt))}` : ''}.`
    : '';
  if (box.textContent === text) return; // the same words are not announced again
  fill(box, text ? el('p', {}, text) : null);
}

// ---- counts in the header -----------------------------------------------------------------

export function showCounts(counts, currentStatus) {
  serverWasAt(counts.counted_at);
  const { counted_at: _, ...shown } = counts;
  const key = JSON.stringify([shown, currentStatus]);
  const nav = document.getElementById('counts');
  if (key === state.counts && nav.childElementCount) return;
  const chips = STATUSES.map((s) => {
    const href = `#/?status=${s}`;
    return el('a', {
      href, 'aria-current': currentStatus === s ? 'true' : 'false', class: 'badge-chip', dataset: { key: href },
    }, `${s.toLowerCase()} ${counts.by_status[s] ?? 0}`);
  });
  chips.push(el('a', { href: '#/?needs_attention=1', class: 'flag', dataset: { key: 'attention' } },
    `needs attention ${counts.needs_attention}`));
  if (counts.blocked) {
    chips.push(el('a', { href: '#/?blocked=1', class: 'flag', dataset: { key: 'blocked' } }, `blocked ${counts.blocked}`));
  }
  if (update(nav, chips)) state.counts = key;
}
