// Reloads the page when the desk changes (server-sent events from /events).
// The page works without this script; it only saves pressing reload.
(function () {
  "use strict";
  var body = document.body;
  if (!body || !body.hasAttribute("data-watch") || !window.EventSource) { return; }
  var watch = body.getAttribute("data-watch");
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  var source = new EventSource("/events" + (watch ? "?order=" + encodeURIComponent(watch) : ""));
  source.addEventListener("change", function () {
    if (touched) {
      // Someone is filling in a form: say so instead of throwing their input away.
      document.getElementById("live").hidden = false;
    } else {
      source.close();
      window.location.reload();
    }
  });
  window.addEventListener("beforeunload", function () { source.close(); });
}());
