// vlm-decade view: a filter applies as soon as it changes, and the detector boxes can be hidden.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("filters");
  if (form) {
    form.querySelectorAll("select").forEach((select) => select.addEventListener("change", () => {
      // Empty fields stay out of the address, so links stay short and shareable.
      form.querySelectorAll("select").forEach((s) => { s.disabled = s.value === ""; });
      form.submit();
    }));
  }
  const toggle = document.getElementById("toggle-boxes");
  const boxed = document.getElementById("boxed");
  if (toggle && boxed) {
    toggle.addEventListener("change", () => boxed.classList.toggle("hide-boxes", !toggle.checked));
  }
});
