// The console's state and its talk with the server: the API with the user's token, the
// server's clock as its answers tell it, and signing in.

import { el, fill, field, main, refreshNotice } from './ui.js';
import { route } from './console.js';

const TOKEN_KEY = 'saga-console-token';
// Nothing drives these on their own (the server's SagaStatus::is_terminal): their time axis
// ends at their last activity. A FAILED saga waits for a person, who may still retry it.
export const STOPPED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED', 'FAILED']);
// No operator action changes these any more: their page stops polling.
export const FINISHED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED']);
export const STATUSES = ['QUEUED', 'RUNNING', 'COMPENSATING', 'COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED'];
export const UNKNOWN_OUTCOMES = new Set(['timed_out', 'interrupted', 'abandoned']);
export const FAILED_OUTCOMES = new Set(['failed', 'retryable']);
export const SAGA_POLL_MS = 2000;
export const LIST_POLL_MS = 5000;
export const ZOOMS = [1, 2, 4, 8, 16, 32, 64];
export const EXPAND_BRANCHES_UP_TO = 16;

export const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  me: null,
  definitions: null,
  names: new Set(), // saga names known: the definitions', and any seen in a list
  generation: 0, // bumped at every navigation: pollers of an older page stop
  listCursors: {}, // per filter: the cursors of the pages before the current one
  view: {}, // per saga: zoom, folded groups, selected bar
  counts: null, // the counts last drawn, to draw them only when they change
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  describe() {
    return `${this.status ? this.status : ''}${this.code ? ' ' + this.code : ''}: ${this.message}`.trim();
  }
}

export function describe(e) {
  return e instanceof ApiError ? e.describe() : e.message;
}

export async function api(path, { method = 'GET', body } = {}) {
  const headers = { accept: 'application/json' };
  if (state.token) headers.authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let response;
  const sent = Date.now();
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `the server did not answer (${e.message})`);
  }
  // The Date header is the server's clock to the second, read between `sent` and now.
  const date = Date.parse(response.headers.get('date') || '');
  if (!Number.isNaN(date)) clockSample(date - Date.now(), date + 1000 - sent);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = data && data.error ? data.error : {};
    throw new ApiError(response.status, err.code, err.message || text || response.statusText);
  }
  return data;
}

export function can(scope) {
  const scopes = (state.me && state.me.scopes) || [];
  return scopes.includes('admin') || scopes.includes(scope);
}

// ---- the server's clock -------------------------------------------------------------------
//
// Running bars, the now-line and "running for" compare the server's timestamps with the
// present, which must then be read on the server's clock, not the browser's. Each answer
// bounds the offset between the two: its Date header (to the second) from both sides, and any
// time the server reports (it is past by then) from below. The bounds of recent answers are
// intersected; the browser's own clock is kept if it lies within them.

const clock = { samples: [], offset: 0 };

function clockSample(lo, hi) {
  const at = Date.now();
  clock.samples.push({ lo, hi, at });
  clock.samples = clock.samples.filter((s) => at - s.at < 600_000).slice(-50);
  let low = -Infinity;
  let high = Infinity;
  for (let i = clock.samples.length - 1; i >= 0; i--) {
    const s = clock.samples[i];
    const l = Math.max(low, s.lo);
    const h = Math.min(high, s.hi);
    if (l > h) break; // an older answer disagrees: one of the clocks was set since
    low = l;
    high = h;
  }
  clock.offset = Math.min(Math.max(0, low), high);
}

/** Notes that the server's clock had reached `iso` by now. */
export function serverWasAt(iso) {
  const t = Date.parse(iso || '');
  if (!Number.isNaN(t)) clockSample(t - Date.now(), Infinity);
}

export function serverNow() {
  return Date.now() + clock.offset;
}

// ---- identity -----------------------------------------------------------------------------

export async function loadMe() {
  try {
    state.me = await api('/v1/whoami');
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      state.me = null;
      return false;
    }
    throw e;
  }
  renderWho();
  return true;
}

function renderWho() {
  const who = document.getElementById('who');
  who.replaceChildren();
  if (!state.me) return;
  const label = state.me.auth_required
    ? `${state.me.name} (${state.me.scopes.join(', ')})`
    : 'open API';
  who.append(el('span', { title: 'The token this tab uses' }, label));
  if (state.me.auth_required) {
    who.append(
      el('button', {
        type: 'button',
        onclick: () => {
          sessionStorage.removeItem(TOKEN_KEY);
          state.token = null;
          state.me = null;
          showLogin();
        },
      }, 'Sign out'),
    );
  }
}

export function showLogin(problem) {
  state.generation += 1;
  state.counts = null;
  refreshNotice(null);
  document.getElementById('counts').replaceChildren();
  renderWho();
  const input = el('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false',
  });
  const error = el('p', { class: 'error-text', role: 'alert', hidden: !problem }, problem || '');
  const form = el('form', {
    class: 'login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      state.token = input.value.trim();
      if (await loadMe()) {
        sessionStorage.setItem(TOKEN_KEY, state.token);
        route();
      } else {
        state.token = null;
        error.textContent = 'This token is not accepted by the server.';
        error.hidden = false;
      }
    },
  },
  el('h1', {}, 'Sign in'),
  el('p', { class: 'muted' }, 'This server asks for an API token. It is kept for this tab only.'),
  field('token', 'API token', input),
  error,
  el('div', {}, el('button', { class: 'primary', type: 'submit' }, 'Sign in')));
  fill(main(), form);
  input.focus();
}
