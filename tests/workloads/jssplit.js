// A known 3:1 split between two JavaScript functions (tests/it/runtimes.rs),
// run by node with --perf-basic-prof so its JIT code is named. A round's
// work varies at random: fixed rounds phase-lock with the sampling period.
// Rounds are short, so the split holds before V8 has compiled `work`: with
// rounds ten times longer, an emulated CPU spent its first seconds in one
// interpreted heavyJs call (321 heavy to 45 light samples).
function work(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s += (i * i) % 7;
  }
  return s;
}
function heavyJs(n) {
  return work(3 * n);
}
function lightJs(n) {
  return work(n);
}
const end = Date.now() + 1000 * Number(process.argv[2] || 2);
let t = 0;
while (Date.now() < end) {
  const n = 5000 + Math.floor(Math.random() * 10001);
  t += heavyJs(n);
  t += lightJs(n);
}
console.log(t > 0 ? "done" : "");
