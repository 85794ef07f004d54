#version 450
// probe_empty.comp: does nothing; timing many dispatches of it gives the fixed cost of one
// dispatch plus barrier. Dispatch: (1, 1, 1), 1 invocation. No bindings used.
layout(local_size_x = 1) in;
void main() {}
