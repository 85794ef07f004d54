/* jinja_render.c: the renderer (kvg_jinja_render): walks the syntax tree over scopes of
 * variables, evaluates expressions (operators here; filters, tests, methods and global functions
 * through jinja_builtins.c's tables), runs loops and macros, and writes the output with a flag
 * per byte that says whether it came from message content. Bounded by the output size, the
 * nesting of evaluation and of macro calls, and the number of loop iterations. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "jinja_internal.h"
#include "kvg_host.h"
#include "kvg_json.h"

typedef struct scope {
    struct scope *parent;
    jdict *vars;
} scope;

typedef struct rctx {
    jx *x;
    sbuf out; /* what is rendered (a macro or set block renders into its own) */
    scope *globals;
    int depth, calls;
    long iterations;
    int loop_ctl; /* 1 break, 2 continue */
} rctx;

static void out_add(rctx *r, const char *p, size_t n, const unsigned char *u, size_t pos) {
    if (r->out.n + n > MAX_OUTPUT) kvg_jx_fail(r->x, pos, "output longer than %d bytes", MAX_OUTPUT);
    kvg_sb_add(r->x, &r->out, p, n, u, 0);
}

static jv *lookup(rctx *r, scope *s, const char *name) {
    (void)r;
    for (; s; s = s->parent) {
        jv *v = kvg_jdict_find(s->vars, name, strlen(name));
        if (v) return v;
    }
    return NULL;
}

static jv eval(rctx *r, scope *s, const node *n);

static void eval_args(rctx *r, scope *s, const node *call, args *a, int first) {
    a->n = first;
    a->nkw = 0;
    if (call->kids.n + first > 16 || call->kids2.n > 16) kvg_jx_fail(r->x, call->pos, "too many arguments");
    for (int i = 0; i < call->kids.n; i++) a->v[a->n++] = eval(r, s, call->kids.v[i]);
    for (int i = 0; i < call->kids2.n; i++) {
        a->kwn[a->nkw] = call->kids2.v[i]->name;
        a->kwv[a->nkw++] = eval(r, s, call->kids2.v[i]->a);
    }
}

static void exec_body(rctx *r, scope *s, const nlist *body);

static jv call_macro(rctx *r, const node *m, const args *a, size_t pos) {
    jx *x = r->x;
    if (++r->calls > MAX_CALLS) kvg_jx_fail(x, pos, "macro calls nested more than %d deep", MAX_CALLS);
    scope sc = {.parent = r->globals, .vars = kvg_jdict_new(x)};
    if (a->n > m->kids2.n) kvg_jx_fail(x, pos, "macro '%s' takes %d arguments, got %d", m->name, m->kids2.n, a->n);
    for (int i = 0; i < m->kids2.n; i++) {
        const node *pm = m->kids2.v[i];
        jv v = arg(a, i, pm->name);
        if (v.t == V_UNDEF && pm->a) v = eval(r, &sc, pm->a);
        kvg_jdict_setc(x, sc.vars, pm->name, v);
    }
    for (int k = 0; k < a->nkw; k++) {
        int found = 0;
        for (int i = 0; i < m->kids2.n; i++) found |= strcmp(m->kids2.v[i]->name, a->kwn[k]) == 0;
        if (!found) kvg_jx_fail(x, pos, "macro '%s' has no argument '%s'", m->name, a->kwn[k]);
    }
    /* the macro renders into its own buffer: its text is its value */
    sbuf saved = r->out;
    r->out = (sbuf){0};
    exec_body(r, &sc, &m->kids);
    sbuf got = r->out;
    r->out = saved;
    jstr *s = kvg_sb_done(x, &got);
    r->calls--;
    return mk_str(s);
}

/* obj.name(a): a builtin method of obj's type, else a macro that a dict holds under name */
static jv call_method(rctx *r, const jv *obj, const char *name, const args *a, size_t pos) {
    int found;
    jv v = kvg_jinja_method(r->x, obj, name, a, pos, &found);
    if (found) return v;
    if (obj->t == V_DICT) {
        jv *f = kvg_jdict_find(obj->d, name, strlen(name));
        if (f && f->t == V_MACRO) return call_macro(r, f->m, a, pos);
    }
    kvg_jx_fail(r->x, pos, "a %s has no method '%s'", kvg_jv_type_name(obj), name);
}

static jv arith(rctx *r, const char *op, const jv *a, const jv *b, size_t pos) {
    jx *x = r->x;
    if (op[0] == '~') {
        const jstr *sa = kvg_jv_str(x, a);
        return mk_str(kvg_jstr_cat(x, sa, kvg_jv_str(x, b)));
    }
    if (op[0] == '+' && a->t == V_STR && b->t == V_STR) return mk_str(kvg_jstr_cat(x, a->s, b->s));
    if (op[0] == '+' && a->t == V_LIST && b->t == V_LIST) {
        jlist *l = kvg_jlist_new(x);
        kvg_jx_charge(x, (a->l->n + b->l->n) * sizeof(jv));
        for (size_t i = 0; i < a->l->n; i++) kvg_jlist_push(x, l, a->l->v[i]);
        for (size_t i = 0; i < b->l->n; i++) kvg_jlist_push(x, l, b->l->v[i]);
        return (jv){.t = V_LIST, .l = l};
    }
    if (op[0] == '*' && op[1] == 0 && ((a->t == V_STR && b->t == V_INT) || (a->t == V_INT && b->t == V_STR))) {
        const jstr *s = a->t == V_STR ? a->s : b->s;
        int64_t k = a->t == V_INT ? a->i : b->i;
        if (k > 0 && (uint64_t)k * s->n > MAX_OUTPUT) kvg_jx_fail(x, pos, "string repeated past %d bytes", MAX_OUTPUT);
        sbuf sb = {0};
        if (s->n == 0) k = 0; /* nothing to repeat: no loop of k empty steps */
        for (int64_t i = 0; i < k; i++) kvg_sb_str(x, &sb, s);
        return mk_str(kvg_sb_done(x, &sb));
    }
    if (!num(a) || !num(b))
        kvg_jx_fail(x, pos, "operator '%s' on a %s and a %s", op, kvg_jv_type_name(a), kvg_jv_type_name(b));
    int fl = a->t == V_FLOAT || b->t == V_FLOAT;
    double fa = as_f(a), fb = as_f(b);
    int64_t ia = as_i(a), ib = as_i(b);
    switch (op[0]) {
    case '+': return fl ? mk_float(fa + fb) : mk_int((int64_t)((uint64_t)ia + (uint64_t)ib));
    case '-': return fl ? mk_float(fa - fb) : mk_int((int64_t)((uint64_t)ia - (uint64_t)ib));
    case '*':
        if (op[1] == '*') {
            if (fl || ib < 0) return mk_float(pow(fa, fb));
            int64_t p = 1;
            for (int64_t i = 0; i < ib && i < 64; i++) p = (int64_t)((uint64_t)p * (uint64_t)ia);
            return mk_int(p);
        }
        return fl ? mk_float(fa * fb) : mk_int((int64_t)((uint64_t)ia * (uint64_t)ib));
    case '/':
        if (fb == 0) kvg_jx_fail(x, pos, "division by zero");
        if (op[1] == '/') {
            if (fl) return mk_float(floor(fa / fb));
            if (ia == INT64_MIN && ib == -1) kvg_jx_fail(x, pos, "integer overflow");
            int64_t q = ia / ib;
            if ((ia % ib != 0) && ((ia < 0) != (ib < 0))) q--;
            return mk_int(q);
        }
        return mk_float(fa / fb);
    case '%':
        if (fb == 0) kvg_jx_fail(x, pos, "modulo by zero");
        if (fl) {
            double m = fmod(fa, fb);
            if (m != 0 && ((m < 0) != (fb < 0))) m += fb;
            return mk_float(m);
        }
        if (ib == -1) return mk_int(0);
        {
            int64_t m = ia % ib;
            if (m != 0 && ((m < 0) != (ib < 0))) m += ib;
            return mk_int(m);
        }
    default: kvg_jx_fail(x, pos, "unknown operator '%s'", op);
    }
}

static jv eval(rctx *r, scope *s, const node *n) {
    jx *x = r->x;
    if (++r->depth > MAX_DEPTH) kvg_jx_fail(x, n->pos, "evaluation nested more than %d deep", MAX_DEPTH);
    x->at = n->pos;
    jv v = UNDEF;
    switch (n->kind) {
    case N_LIT: v = n->lit; break;
    case N_NAME: {
        jv *f = lookup(r, s, n->name);
        v = f ? *f : UNDEF;
        break;
    }
    case N_ATTR: {
        jv o = eval(r, s, n->a);
        v = kvg_jv_attr(x, &o, n->name, n->pos);
        break;
    }
    case N_ITEM: {
        jv o = eval(r, s, n->a), k = eval(r, s, n->b);
        v = kvg_jv_item(x, &o, &k, n->pos);
        break;
    }
    case N_SLICE: {
        jv o = eval(r, s, n->a);
        jv a = n->b ? eval(r, s, n->b) : UNDEF, b = n->c ? eval(r, s, n->c) : UNDEF;
        jv c = n->kids.v[0] ? eval(r, s, n->kids.v[0]) : UNDEF;
        v = kvg_jv_slice(x, &o, &a, &b, &c, n->pos);
        break;
    }
    case N_CALL: {
        args a;
        if (n->a->kind == N_ATTR) {
            jv o = eval(r, s, n->a->a);
            if (!(o.t == V_DICT && kvg_jdict_find(o.d, n->a->name, strlen(n->a->name)) &&
                  kvg_jdict_find(o.d, n->a->name, strlen(n->a->name))->t != V_MACRO)) {
                eval_args(r, s, n, &a, 0);
                v = call_method(r, &o, n->a->name, &a, n->pos);
                break;
            }
        }
        jv f = eval(r, s, n->a);
        eval_args(r, s, n, &a, 0);
        if (f.t == V_MACRO) v = call_macro(r, f.m, &a, n->pos);
        else if (f.t == V_FUNC) v = f.fn->fn(x, &a, n->pos, f.fn->mode);
        else if (n->a->kind == N_NAME) kvg_jx_fail(x, n->pos, "'%s' is %s, not callable", n->a->name,
                                                   f.t == V_UNDEF ? "undefined" : kvg_jv_type_name(&f));
        else kvg_jx_fail(x, n->pos, "a %s is not callable", kvg_jv_type_name(&f));
        break;
    }
    case N_FILTER: {
        jv o = eval(r, s, n->a);
        args a;
        eval_args(r, s, n, &a, 0);
        v = kvg_jinja_filter(x, n->name, &o, &a, n->pos);
        break;
    }
    case N_TEST: {
        jv o = eval(r, s, n->a);
        args a;
        eval_args(r, s, n, &a, 0);
        v = mk_bool(kvg_jinja_test(x, n->name, &o, &a, n->pos) != n->neg);
        break;
    }
    case N_NOT: {
        jv o = eval(r, s, n->a);
        v = mk_bool(!kvg_jv_truthy(&o));
        break;
    }
    case N_NEG: {
        jv o = eval(r, s, n->a);
        if (o.t == V_INT) v = mk_int((int64_t)(0 - (uint64_t)o.i));
        else if (num(&o)) v = mk_float(-as_f(&o));
        else kvg_jx_fail(x, n->pos, "cannot negate a %s", kvg_jv_type_name(&o));
        break;
    }
    case N_AND:
    case N_OR: {
        jv a = eval(r, s, n->a);
        int t = kvg_jv_truthy(&a);
        v = (n->kind == N_AND ? !t : t) ? a : eval(r, s, n->b);
        break;
    }
    case N_COND: {
        jv c = eval(r, s, n->a);
        v = kvg_jv_truthy(&c) ? eval(r, s, n->b) : n->c ? eval(r, s, n->c) : UNDEF;
        break;
    }
    case N_BIN: {
        jv a = eval(r, s, n->a), b = eval(r, s, n->b);
        const char *op = n->name;
        if (!strcmp(op, "==")) v = mk_bool(kvg_jv_equal(x, &a, &b));
        else if (!strcmp(op, "!=")) v = mk_bool(!kvg_jv_equal(x, &a, &b));
        else if (!strcmp(op, "<")) v = mk_bool(kvg_jv_compare(x, &a, &b, n->pos) < 0);
        else if (!strcmp(op, "<=")) v = mk_bool(kvg_jv_compare(x, &a, &b, n->pos) <= 0);
        else if (!strcmp(op, ">")) v = mk_bool(kvg_jv_compare(x, &a, &b, n->pos) > 0);
        else if (!strcmp(op, ">=")) v = mk_bool(kvg_jv_compare(x, &a, &b, n->pos) >= 0);
        else if (!strcmp(op, "in")) v = mk_bool(kvg_jv_contains(x, &b, &a, n->pos));
        else if (!strcmp(op, "not in")) v = mk_bool(!kvg_jv_contains(x, &b, &a, n->pos));
        else v = arith(r, op, &a, &b, n->pos);
        break;
    }
    case N_LIST: {
        jlist *l = kvg_jlist_new(x);
        for (int i = 0; i < n->kids.n; i++) kvg_jlist_push(x, l, eval(r, s, n->kids.v[i]));
        l->tuple = n->neg;
        v = (jv){.t = V_LIST, .l = l};
        break;
    }
    case N_DICT: {
        jdict *d = kvg_jdict_new(x);
        for (int i = 0; i < n->kids.n; i++) {
            jv k = eval(r, s, n->kids.v[i]->a);
            kvg_jdict_put(x, d, k, eval(r, s, n->kids.v[i]->b), n->kids.v[i]->pos);
        }
        v = (jv){.t = V_DICT, .d = d};
        break;
    }
    default: kvg_jx_fail(x, n->pos, "not an expression");
    }
    r->depth--;
    return v;
}

static void assign(rctx *r, scope *s, const node *target, jv v) {
    jx *x = r->x;
    if (target->kind == N_NAME) {
        kvg_jdict_setc(x, s->vars, target->name, v);
    } else if (target->kind == N_ATTR) {
        jv o = eval(r, s, target->a);
        if (o.t != V_DICT || !o.d->ns)
            kvg_jx_fail(x, target->pos, "can set attribute '%s' only on a namespace(), not on a %s", target->name,
                        kvg_jv_type_name(&o));
        kvg_jdict_setc(x, o.d, target->name, v);
    } else { /* a, b = ... */
        if (v.t != V_LIST || (int)v.l->n != target->kids.n)
            kvg_jx_fail(x, target->pos, "cannot unpack a %s into %d names", kvg_jv_type_name(&v), target->kids.n);
        for (int i = 0; i < target->kids.n; i++) assign(r, s, target->kids.v[i], v.l->v[i]);
    }
}

static void emit(rctx *r, const jv *v, size_t pos) {
    if (v->t == V_UNDEF) return;
    const jstr *s = kvg_jv_str(r->x, v);
    out_add(r, s->p, s->n, s->u, pos);
}

static void exec_for(rctx *r, scope *s, const node *n) {
    jx *x = r->x;
    jv it = eval(r, s, n->a);
    jlist *items = kvg_jv_items(x, &it, n->a->pos);
    const node *targets = n->c;
    scope sc = {.parent = s, .vars = kvg_jdict_new(x)};
    if (n->b) { /* {% for x in xs if cond %}: loop.* counts the kept items */
        jlist *kept = kvg_jlist_new(x);
        for (size_t i = 0; i < items->n; i++) {
            if (++r->iterations > MAX_ITERATIONS)
                kvg_jx_fail(x, n->pos, "more than %d loop iterations", MAX_ITERATIONS);
            assign(r, &sc, targets->kids.n == 1 ? targets->kids.v[0] : targets, items->v[i]);
            jv c = eval(r, &sc, n->b);
            if (kvg_jv_truthy(&c)) kvg_jlist_push(x, kept, items->v[i]);
        }
        items = kept;
    }
    if (items->n == 0) {
        exec_body(r, s, &n->kids2);
        return;
    }
    /* one loop object and one scope, updated in place: a long loop does not grow memory */
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                       "length", "depth", "depth0", "previtem", "nextitem"};
    jdict *loop = kvg_jdict_new(x);
    for (int k = 0; k < 11; k++) kvg_jdict_setc(x, loop, keys[k], UNDEF);
    jv loopv = {.t = V_DICT, .d = loop};
    for (size_t i = 0; i < items->n; i++) {
        if (++r->iterations > MAX_ITERATIONS) kvg_jx_fail(x, n->pos, "more than %d loop iterations", MAX_ITERATIONS);
        int64_t len = (int64_t)items->n, k = (int64_t)i;
        loop->v[0] = mk_int(k + 1);
        loop->v[1] = mk_int(k);
        loop->v[2] = mk_int(len - k);
        loop->v[3] = mk_int(len - k - 1);
        loop->v[4] = mk_bool(k == 0);
        loop->v[5] = mk_bool(k == len - 1);
        loop->v[6] = mk_int(len);
        loop->v[7] = mk_int(1);
        loop->v[8] = mk_int(0);
        loop->v[9] = i > 0 ? items->v[i - 1] : UNDEF;
        loop->v[10] = i + 1 < items->n ? items->v[i + 1] : UNDEF;
        sc.vars->n = 0;
        kvg_jdict_setc(x, sc.vars, "loop", loopv);
        assign(r, &sc, targets->kids.n == 1 ? targets->kids.v[0] : targets, items->v[i]);
        exec_body(r, &sc, &n->kids);
        if (r->loop_ctl == 1) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
}

static void exec_body(rctx *r, scope *s, const nlist *body) {
    jx *x = r->x;
    if (++r->depth > MAX_DEPTH) kvg_jx_fail(x, 0, "blocks nested more than %d deep", MAX_DEPTH);
    for (int i = 0; i < body->n && !r->loop_ctl; i++) {
        const node *n = body->v[i];
        x->at = n->pos;
        switch (n->kind) {
        case N_TEXT: out_add(r, n->lit.s->p, n->lit.s->n, NULL, n->pos); break;
        case N_OUT: {
            jv v = eval(r, s, n->a);
            emit(r, &v, n->pos);
            break;
        }
        case N_IF:
            for (int k = 0; k < n->kids.n; k++) {
                const node *br = n->kids.v[k];
                jv c = br->a ? eval(r, s, br->a) : mk_bool(1);
                if (kvg_jv_truthy(&c)) {
                    exec_body(r, s, &br->kids);
                    break;
                }
            }
            break;
        case N_FOR: exec_for(r, s, n); break;
        case N_SET: assign(r, s, n->a, eval(r, s, n->b)); break;
        case N_SETBLOCK: {
            sbuf saved = r->out;
            r->out = (sbuf){0};
            exec_body(r, s, &n->kids);
            sbuf got = r->out;
            r->out = saved;
            jstr *str = kvg_sb_done(x, &got);
            assign(r, s, n->a, mk_str(str));
            break;
        }
        case N_MACRO: kvg_jdict_setc(x, s->vars, n->name, (jv){.t = V_MACRO, .m = n}); break;
        case N_BREAK: r->loop_ctl = 1; break;
        case N_CONTINUE: r->loop_ctl = 2; break;
        case N_BODY: exec_body(r, s, &n->kids); break;
        default: kvg_jx_fail(x, n->pos, "not a statement");
        }
    }
    r->depth--;
}

/* ---- the JSON inputs ----------------------------------------------------------------------- */

/* a string of the caller's data: every byte flagged as content */
static jstr *content_str(jx *x, const char *p, size_t n) {
    jstr *c = kvg_jstr_new(x, p, n, NULL);
    if (n) {
        unsigned char *u = kvg_jx_alloc(x, n);
        memset(u, 1, n);
        c->u = u;
    }
    return c;
}

static jv from_json(jx *x, const kvg_json *j) {
    switch (j->type) {
    case KVG_JSON_NULL: return NONE;
    case KVG_JSON_FALSE: return mk_bool(0);
    case KVG_JSON_TRUE: return mk_bool(1);
    case KVG_JSON_NUMBER: {
        /* Python's json: an integer unless the text has a fraction or an exponent (one past
         * 64 bits, which Python would keep whole, is a float here) */
        int is_int = j->str != NULL;
        for (size_t i = 0; is_int && i < j->len; i++)
            if (j->str[i] == '.' || j->str[i] == 'e' || j->str[i] == 'E') is_int = 0;
        if (is_int) {
            errno = 0;
            long long v = strtoll(j->str, NULL, 10);
            if (errno != ERANGE) return mk_int((int64_t)v);
        }
        return mk_float(j->number);
    }
    case KVG_JSON_STRING: return mk_str(content_str(x, j->str, j->len));
    case KVG_JSON_ARRAY: {
        jlist *l = kvg_jlist_new(x);
        for (const kvg_json *c = j->child; c; c = c->next) kvg_jlist_push(x, l, from_json(x, c));
        return mk_list(l);
    }
    case KVG_JSON_OBJECT: {
        jdict *d = kvg_jdict_new(x);
        for (const kvg_json *c = j->child; c; c = c->next) /* a duplicate key: its last value, as Python's json */
            kvg_jdict_set(x, d, content_str(x, c->key, c->key_len), from_json(x, c));
        return (jv){.t = V_DICT, .d = d};
    }
    }
    return NONE;
}

static bool render_with(const kvg_jinja *t, const kvg_jinja_input *in, const kvg_json *vars, kvg_json *const *fields,
                        kvg_jinja_output *out, char *msg, size_t msg_size) {
    jx x = {.msg = msg, .msg_size = msg_size, .src = t->src, .src_len = t->src_len};
    rctx r = {.x = &x};
    if (setjmp(x.jb)) {
        kvg_jx_free(&x);
        return false;
    }
    scope *g = kvg_jx_alloc(&x, sizeof *g);
    g->vars = kvg_jdict_new(&x);
    r.globals = g;
    jlist *msgs = kvg_jlist_new(&x);
    for (size_t i = 0; i < in->n_messages; i++) {
        jdict *m = kvg_jdict_new(&x);
        const char *role = in->messages[i].role ? in->messages[i].role : "";
        const char *content = in->messages[i].content ? in->messages[i].content : "";
        kvg_jdict_setc(&x, m, "role", mk_str(kvg_jstr_c(&x, role)));
        kvg_jdict_setc(&x, m, "content", mk_str(content_str(&x, content, strlen(content))));
        for (const kvg_json *f = fields && fields[i] ? fields[i]->child : NULL; f; f = f->next)
            if (!(f->key_len == 4 && memcmp(f->key, "role", 4) == 0))
                kvg_jdict_set(&x, m, content_str(&x, f->key, f->key_len), from_json(&x, f));
        kvg_jlist_push(&x, msgs, (jv){.t = V_DICT, .d = m});
    }
    for (size_t i = 0; i < kvg_jinja_n_globals; i++)
        kvg_jdict_setc(&x, g->vars, kvg_jinja_globals[i].name, (jv){.t = V_FUNC, .fn = &kvg_jinja_globals[i]});
    /* as apply_chat_template: tools and documents are none unless given */
    kvg_jdict_setc(&x, g->vars, "tools", NONE);
    kvg_jdict_setc(&x, g->vars, "documents", NONE);
    for (const kvg_json *f = vars ? vars->child : NULL; f; f = f->next) /* over the globals, as jinja2's */
        kvg_jdict_set(&x, g->vars, content_str(&x, f->key, f->key_len), from_json(&x, f));
    kvg_jdict_setc(&x, g->vars, "messages", (jv){.t = V_LIST, .l = msgs});
    kvg_jdict_setc(&x, g->vars, "add_generation_prompt", mk_bool(in->add_generation_prompt));
    kvg_jdict_setc(&x, g->vars, "bos_token", mk_str(kvg_jstr_c(&x, in->bos_token ? in->bos_token : "")));
    kvg_jdict_setc(&x, g->vars, "eos_token", mk_str(kvg_jstr_c(&x, in->eos_token ? in->eos_token : "")));
    exec_body(&r, g, &t->root->kids);
    out->text = kvg_malloc(r.out.n + 1);
    out->user = kvg_malloc(r.out.n + 1);
    if (!out->text || !out->user) {
        kvg_free(out->text);
        kvg_free(out->user);
        memset(out, 0, sizeof *out);
        snprintf(msg, msg_size, "out of memory for %zu bytes of output", r.out.n);
        kvg_jx_free(&x);
        return false;
    }
    if (r.out.n) {
        memcpy(out->text, r.out.p, r.out.n);
        memcpy(out->user, r.out.u, r.out.n);
    }
    out->text[r.out.n] = 0;
    out->user[r.out.n] = 0;
    out->len = r.out.n;
    kvg_jx_free(&x);
    return true;
}

enum { JSON_DEPTH = 64 };

/* A JSON object input (what: its name for a message): NULL when text is NULL; false with msg
 * written when it is not a JSON object. */
static bool parse_object(const char *text, const char *what, kvg_json **out, char *msg, size_t msg_size) {
    *out = NULL;
    if (!text) return true;
    char why[160];
    size_t at = 0;
    kvg_json *j = kvg_json_parse_ex(text, strlen(text), JSON_DEPTH, KVG_JSON_NUMBER_TEXT, NULL, &at, why, sizeof why);
    if (!j) {
        snprintf(msg, msg_size, "%s: %s", what, why);
        return false;
    }
    if (j->type != KVG_JSON_OBJECT) {
        kvg_json_free(j);
        snprintf(msg, msg_size, "%s: not a JSON object", what);
        return false;
    }
    *out = j;
    return true;
}

static void free_inputs(kvg_json *vars, kvg_json **fields, size_t n) {
    kvg_json_free(vars);
    for (size_t i = 0; fields && i < n; i++) kvg_json_free(fields[i]);
    kvg_free(fields);
}

bool kvg_jinja_render(const kvg_jinja *t, const kvg_jinja_input *in, kvg_jinja_output *out, char *msg,
                      size_t msg_size) {
    memset(out, 0, sizeof *out);
    /* the JSON inputs are read before the arena's failure path exists, and freed after it */
    kvg_json *vars = NULL, **fields = NULL;
    if (!parse_object(in->vars, "template variables", &vars, msg, msg_size)) return false;
    bool any_fields = false;
    for (size_t i = 0; i < in->n_messages; i++) any_fields |= in->messages[i].fields != NULL;
    if (any_fields) {
        if (!(fields = kvg_calloc(in->n_messages, sizeof *fields))) {
            kvg_json_free(vars);
            snprintf(msg, msg_size, "out of memory");
            return false;
        }
        for (size_t i = 0; i < in->n_messages; i++) {
            char what[48];
            snprintf(what, sizeof what, "message %zu's fields", i + 1);
            if (!parse_object(in->messages[i].fields, what, &fields[i], msg, msg_size)) {
                free_inputs(vars, fields, in->n_messages);
                return false;
            }
        }
    }
    bool ok = render_with(t, in, vars, fields, out, msg, msg_size);
    free_inputs(vars, fields, in->n_messages);
    return ok;
}
