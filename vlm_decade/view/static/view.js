// vlm-decade view: a filter applies as soon as it changes, and the detector boxes can be hidden.
document.addEventListener("DOMContentLoaded", () => {
  // Each detector box is placed from its data-box ("x0 y0 x1 y1", fractions of the image): the
  // pages' Content-Security-Policy allows no inline style attributes.
  document.querySelectorAll(".box[data-box]").forEach((box) => {
    const [x0, y0, x1, y1] = box.dataset.box.split(" ").map(Number);
    Object.assign(box.style,
      {left: `${100 * x0}%`, top: `${100 * y0}%`, width: `${100 * (x1 - x0)}%`, height: `${100 * (y1 - y0)}%`});
  });
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
