// Polling a page while it is shown, and saying so when a poll fails: the page stays as it
// was, with a notice, and a refused token asks to sign in again.

import { state } from './state.js';
import { ApiError, describe } from './api.js';
import { refreshNotice } from './ui.js';
import { showLogin } from './login.js';

/**
 * Runs `tick` now (its error goes to the caller, which shows it) and then every `every` ms
 * while the page of `generation` is shown and `tick` does not answer `false`. `tick` gets a
 * function that tells whether that page is still the one shown: checked after each wait, so
 * that a page left while it loaded never draws over the next one. A later failure leaves the
 * page as it was, with a notice saying so until a poll succeeds.
 */
export async function poll(generation, tick, every, gone = 'the server no longer has it') {
  const current = () => generation === state.generation;
  let shownAt = Date.now();
  const run = async () => {
    if (!current()) return;
    if (document.hidden) {
      setTimeout(run, every);
      return;
    }
    let again = true;
    try {
      again = (await tick(current)) !== false;
      if (current()) {
        shownAt = Date.now();
        refreshNotice(null);
      }
    } catch (e) {
      if (!current()) return;
      if (e instanceof ApiError && e.status === 401) {
        showLogin('The token was refused.');
        return;
      }
      if (e instanceof ApiError && e.status === 404) {
        refreshNotice(`Not refreshed: ${gone}`, shownAt);
        return; // it will not come back
      }
      refreshNotice(`Could not refresh: ${describe(e)}`, shownAt);
    }
    if (again && current()) setTimeout(run, every);
  };
  if ((await tick(current)) !== false && current()) setTimeout(run, every);
}

/**
 * Polls the page now shown with `tick` every `every` ms, as `poll` does, and makes
 * `state.refresh` (what an action calls once it changed something) start the poll again at
 * once, as a new generation of the page.
 */
export async function pollRefreshable(tick, every) {
  state.refresh = () => {
    state.generation += 1;
    const generation = state.generation;
    poll(generation, tick, every).catch((e) => {
      if (generation === state.generation) refreshNotice(`Could not refresh: ${e.message}`, null);
    });
  };
  await poll(state.generation, tick, every);
}
