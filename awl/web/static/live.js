// Reloads the page when the desk changes (server-sent events from /events).
// The page works without this script; it only saves pressing reload.
(function () {
  "use strict";
  var body = document.body;
  if (!body || !body.hasAttribute("data-events") || !window.EventSource) { return; }
  // The stream's address as the page made it, the order's id encoded in it already.
  var events = body.getAttribute("data-events");
  // The desk's state this page was made from: a change before the stream opens still counts.
  var since = body.getAttribute("data-since") || "";
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  var source = new EventSource(events + (events.indexOf("?") < 0 ? "?" : "&") +
                               "since=" + encodeURIComponent(since));
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
