// What every module of the console shares and none of them owns: the statuses and timings
// the pages go by, the tab's state (the token, who it names, the page shown), and the hook
// through which any of them asks console.js to draw the page the address names again.

// Where the token is kept: sessionStorage, for this tab only.
export const TOKEN_KEY = 'saga-console-token';
// Nothing drives these on their own (the server's SagaStatus::is_terminal): their time axis
// ends at their last activity. A FAILED saga waits for a person, who may still retry it.
export const STOPPED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED', 'FAILED']);
// No operator action changes these any more: their page stops polling.
export const FINISHED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED']);
export const STATUSES = ['QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED', 'COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED'];
// The statuses a saga may be paused in (SPEC §13): not finished, not already paused, not FAILED.
export const PAUSABLE = new Set(['QUEUED', 'RUNNING', 'COMPENSATING']);
// The actions of a bulk job (POST /v1/bulk), in the order the list offers them.
export const BULK_ACTIONS = ['cancel', 'pause', 'resume', 'retry', 'abort', 'fork'];
export const BULK_POLL_MS = 1000;
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

// ---- routing again --------------------------------------------------------------------------
//
// console.js routes, so it imports every page. A page, or the sign-in form, that wants the
// current route drawn again calls `route` here, which console.js points at its router: no
// module imports one that imports it.

let router = async () => undefined;

/** Sets what `route` runs: console.js's router, once, as the page loads. */
export function setRouter(fn) {
  router = fn;
}

/** Draws the page the address names again (through console.js's router). */
export function route() {
  return router();
}
