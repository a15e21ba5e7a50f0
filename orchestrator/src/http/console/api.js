// The console's talk with the server: the API with the user's token, its errors, and the
// server's clock as its answers tell it.

import { state } from './state.js';

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
