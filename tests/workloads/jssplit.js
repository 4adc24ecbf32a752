// A known 3:1 split between two JavaScript functions (tests/it/runtimes.rs),
// run by node with --perf-basic-prof so its JIT code is named.
function work(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s += (i * i) % 7;
  }
  return s;
}
function heavyJs() {
  return work(300000);
}
function lightJs() {
  return work(100000);
}
const end = Date.now() + 1000 * Number(process.argv[2] || 2);
let t = 0;
while (Date.now() < end) {
  t += heavyJs();
  t += lightJs();
}
console.log(t > 0 ? "done" : "");
