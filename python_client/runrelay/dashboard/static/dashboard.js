// runrelay dashboard: keep the parts of the page marked data-live current.
//
// The server sends a `change` event on /live when the database notified a
// change (at most one a second) and a `tick` every 15 s otherwise. On either,
// the page fetches itself and swaps each data-live region whose HTML changed,
// except one holding the focus (someone is typing or about to click there).
// Without a working event stream it polls every 5 s instead.
(function () {
  "use strict";
  var POLL_MS = 5000;
  var busy = false;
  var again = false;
  var poller = null;
  var state = document.getElementById("live-state");

  function regions() {
    return document.querySelectorAll("[data-live]");
  }

  // A form's call id is new at every render; it is not a change to show.
  function comparable(html) {
    return html.replace(/name="call_id" value="[^"]*"/g, "");
  }

  function setState(mode, title) {
    document.body.dataset.liveMode = mode;
    if (state) {
      state.className = "live-state live-" + mode;
      state.title = "live updates: " + title;
    }
  }

  function swap(doc) {
    regions().forEach(function (el) {
      var fresh = doc.querySelector('[data-live="' + el.dataset.live + '"]');
      if (!fresh) return;
      var focused = document.activeElement;
      if (focused && focused !== document.body && el.contains(focused)) return;
      if (comparable(fresh.innerHTML) === comparable(el.innerHTML)) return;
      var open = {};
      el.querySelectorAll("details[open][data-key]").forEach(function (d) {
        open[d.dataset.key] = true;
      });
      el.innerHTML = fresh.innerHTML;
      el.querySelectorAll("details[data-key]").forEach(function (d) {
        if (open[d.dataset.key]) d.open = true;
      });
    });
  }

  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    // The header tells the server this is a refresh: it leaves the session
    // (and the line an action left for the next page) alone.
    fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "runrelay-live" },
    })
      .then(function (response) {
        if (!response.ok || response.redirected) return null;
        return response.text();
      })
      .then(function (html) {
        if (html === null) return;
        swap(new DOMParser().parseFromString(html, "text/html"));
        document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      });
  }

  function poll() {
    if (poller === null) poller = window.setInterval(refresh, POLL_MS);
    setState("polling", "polling every " + POLL_MS / 1000 + " s");
  }

  // Forms that ask first (pause a queue, cancel a run).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  if (!regions().length) return;
  if (!("EventSource" in window)) {
    poll();
    return;
  }
  var source = new EventSource(document.body.dataset.liveUrl);
  source.addEventListener("change", refresh);
  source.addEventListener("tick", refresh);
  source.onopen = function () {
    if (poller !== null) {
      window.clearInterval(poller);
      poller = null;
    }
    setState("sse", "on, from database notifications");
  };
  source.onerror = function () {
    poll();
  };
})();
