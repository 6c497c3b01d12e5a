// "Approve all" asks first, naming how many effects and which tools (BIND-24). Without this
// script the page asks on a page of its own instead.
(function () {
  "use strict";
  var form = document.getElementById("approve-all-form");
  if (!form) { return; }
  form.addEventListener("submit", function (event) {
    if (!window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
      return;
    }
    form.elements.confirmed.value = form.elements.count.value;
  });
}());
