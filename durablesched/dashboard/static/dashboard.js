// durablesched dashboard: live parts of pages, and actions without leaving the page.
// Each element with data-poll is fetched again (its fragment) every data-poll-ms
// milliseconds (2 s; never under 1 s), while the page is visible and no request for
// it is under way; a form with data-action posts through fetch, after a confirm for
// those with data-confirm ({n}: how many boxes are ticked).
"use strict";

(function () {
  function refresh(region) {
    if (document.hidden) {
      return Promise.resolve();
    }
    const active = document.activeElement;
    if (region.querySelector("input[type=checkbox]:checked") ||
        (active && region.contains(active) && active.matches("input, select, textarea"))) {
      return Promise.resolve();  // the user is choosing: do not pull it from under them
    }
    const url = new URL(region.dataset.poll, window.location.href);
    url.searchParams.set("fragment", "1");
    return fetch(url, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (html) {
        region.innerHTML = html;
        region.classList.remove("stale");
        region.dataset.updated = String(Date.now());
      })
      .catch(function () {
        region.classList.add("stale");
      });
  }

  function poll(region) {
    const every = Math.max(Number(region.dataset.pollMs) || 2000, 1000);
    let busy = false;
    window.setInterval(function () {
      if (busy) {
        return;
      }
      busy = true;
      refresh(region).finally(function () {
        busy = false;
      });
    }, every);
  }

  function flash(text, bad) {
    const box = document.getElementById("flash");
    if (!box) {
      return;
    }
    box.textContent = text;
    box.classList.toggle("bad", Boolean(bad));
    box.hidden = false;
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-action")) {
      return;
    }
    event.preventDefault();
    const button = event.submitter;
    const ask = (button && button.dataset.confirm) || form.dataset.confirm;
    if (ask) {
      const ticked = form.querySelectorAll("input[name=ids]:checked").length;
      if (!window.confirm(ask.replace("{n}", String(ticked)))) {
        return;
      }
    }
    const body = new FormData(form, button || undefined);
    // getAttribute: a field named "action" (the bulk form's buttons) shadows form.action.
    fetch(form.getAttribute("action"), {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: {"X-Requested-With": "fetch"},
    })
      .then(function (response) {
        return response.json().then(function (answer) {
          return {ok: response.ok, answer: answer};
        });
      })
      .then(function (result) {
        flash(result.ok ? result.answer.message : result.answer.error, !result.ok);
        if (result.ok && form.dataset.then) {
          window.location.assign(form.dataset.then);
          return;
        }
        form.querySelectorAll("input[name=ids]:checked").forEach(function (box) {
          box.checked = false;
        });
        document.querySelectorAll("[data-poll]").forEach(refresh);
      })
      .catch(function () {
        flash("the dashboard did not answer", true);
      });
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(poll);
  });
})();
