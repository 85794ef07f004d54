/* jinja_parse.c: tokens to a syntax tree by recursive descent (kvg_jinja_parse,
 * kvg_jinja_free). Expressions follow Jinja's precedence (if-else, or, and, not, comparisons and
 * `in`, + -, ~, * / // %, **, unary minus, then filters and tests, then postfix . [] ()); a
 * statement's body runs until one of the tag names that may end it. */
#include <stdio.h>
#include "jinja_internal.h"
#include "kvg_host.h"

typedef struct parser {
    jx *x;
    tok *t;
    size_t i;
    int depth;
} parser;

static node *mk(parser *P, int kind, size_t pos) {
    node *n = kvg_jx_alloc(P->x, sizeof *n);
    n->kind = kind;
    n->pos = pos;
    return n;
}
static void nl_push(jx *x, nlist *l, node *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        node **v = kvg_jx_alloc(x, (size_t)cap * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static tok *cur(parser *P) { return &P->t[P->i]; }
static int is_op(const tok *t, const char *op) {
    return t->k == T_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
static int is_name(const tok *t, const char *nm) {
    return t->k == T_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0;
}
static const char *tok_desc(parser *P, const tok *t) {
    static const char *const kinds[] = {"text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string", "integer",
                                        "number", "operator", "end of template"};
    if (t->k == T_NAME || t->k == T_OP) {
        char *d = kvg_jx_alloc(P->x, t->n + 3);
        d[0] = '\'';
        memcpy(d + 1, t->p, t->n);
        d[t->n + 1] = '\'';
        return d;
    }
    return kinds[t->k];
}
static void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) kvg_jx_fail(P->x, cur(P)->pos, "expected '%s', got %s", op, tok_desc(P, cur(P)));
    P->i++;
}
static const char *expect_name(parser *P) {
    tok *t = cur(P);
    if (t->k != T_NAME) kvg_jx_fail(P->x, t->pos, "expected a name, got %s", tok_desc(P, t));
    P->i++;
    return kvg_jx_cstr(P->x, t->p, t->n);
}
static void enter(parser *P) {
    if (++P->depth > MAX_DEPTH)
        kvg_jx_fail(P->x, cur(P)->pos, "template nested too deeply (more than %d levels)", MAX_DEPTH);
}

static node *p_expr(parser *P);
static node *p_unary(parser *P, int with_filter);

static void p_args(parser *P, node *call) {
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        tok *t = cur(P);
        if (t->k == T_NAME && is_op(&P->t[P->i + 1], "=")) {
            node *kw = mk(P, N_KWARG, t->pos);
            kw->name = kvg_jx_cstr(P->x, t->p, t->n);
            P->i += 2;
            kw->a = p_expr(P);
            nl_push(P->x, &call->kids2, kw);
        } else {
            nl_push(P->x, &call->kids, p_expr(P));
        }
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    expect_op(P, ")");
}

static node *p_primary(parser *P) {
    tok *t = cur(P);
    node *n;
    enter(P);
    if (t->k == T_NAME) {
        P->i++;
        n = mk(P, N_LIT, t->pos);
        if (is_name(t, "true") || is_name(t, "True")) n->lit = mk_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = mk_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) n->lit = NONE;
        else {
            n->kind = N_NAME;
            n->name = kvg_jx_cstr(P->x, t->p, t->n);
        }
    } else if (t->k == T_STR) {
        sbuf b = {0};
        while (cur(P)->k == T_STR) { /* adjacent literals concatenate */
            kvg_sb_add(P->x, &b, cur(P)->p, cur(P)->n, NULL, 0);
            P->i++;
        }
        n = mk(P, N_LIT, t->pos);
        n->lit = mk_str(kvg_sb_done(P->x, &b));
    } else if (t->k == T_INT || t->k == T_FLOAT) {
        P->i++;
        n = mk(P, N_LIT, t->pos);
        n->lit = t->k == T_INT ? mk_int(t->i) : mk_float(t->f);
    } else if (is_op(t, "(")) {
        P->i++;
        if (is_op(cur(P), ")")) {
            P->i++;
            n = mk(P, N_LIST, t->pos);
            n->neg = 1;
        } else {
            n = p_expr(P);
            if (is_op(cur(P), ",")) { /* a tuple */
                node *l = mk(P, N_LIST, t->pos);
                l->neg = 1;
                nl_push(P->x, &l->kids, n);
                while (is_op(cur(P), ",")) {
                    P->i++;
                    if (is_op(cur(P), ")")) break;
                    nl_push(P->x, &l->kids, p_expr(P));
                }
                n = l;
            }
            expect_op(P, ")");
        }
    } else if (is_op(t, "[")) {
        P->i++;
        n = mk(P, N_LIST, t->pos);
        while (!is_op(cur(P), "]")) {
            nl_push(P->x, &n->kids, p_expr(P));
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, "]");
    } else if (is_op(t, "{")) {
        P->i++;
        n = mk(P, N_DICT, t->pos);
        while (!is_op(cur(P), "}")) {
            node *pr = mk(P, N_PAIR, cur(P)->pos);
            pr->a = p_expr(P);
            expect_op(P, ":");
            pr->b = p_expr(P);
            nl_push(P->x, &n->kids, pr);
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, "}");
    } else {
        kvg_jx_fail(P->x, t->pos, "expected an expression, got %s", tok_desc(P, t));
    }
    P->depth--;
    return n;
}

static node *p_postfix(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            tok *a = cur(P);
            node *g = mk(P, N_ATTR, a->pos);
            g->a = n;
            if (a->k == T_INT) {
                g->kind = N_ITEM;
                g->b = mk(P, N_LIT, a->pos);
                g->b->lit = mk_int(a->i);
                P->i++;
            } else {
                g->name = expect_name(P);
            }
            n = g;
        } else if (is_op(t, "[")) {
            P->i++;
            node *g = mk(P, N_ITEM, t->pos);
            g->a = n;
            node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(cur(P), ":")) {
                    if (++colons > 2) kvg_jx_fail(P->x, cur(P)->pos, "a slice has at most two ':'");
                    P->i++;
                    continue;
                }
                if (is_op(cur(P), "]")) break;
                if (parts[colons]) kvg_jx_fail(P->x, cur(P)->pos, "expected ':' or ']', got %s", tok_desc(P, cur(P)));
                parts[colons] = p_expr(P);
            }
            expect_op(P, "]");
            if (colons) {
                g->kind = N_SLICE;
                g->b = parts[0];
                g->c = parts[1];
                nl_push(P->x, &g->kids, parts[2]);
            } else {
                if (!parts[0]) kvg_jx_fail(P->x, t->pos, "empty subscript");
                g->b = parts[0];
            }
            n = g;
        } else if (is_op(t, "(")) {
            node *c = mk(P, N_CALL, t->pos);
            c->a = n;
            p_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static int starts_test_arg(const tok *t) {
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) return 1;
    if (t->k == T_NAME)
        return !(is_name(t, "and") || is_name(t, "or") || is_name(t, "else") || is_name(t, "if") ||
                 is_name(t, "in") || is_name(t, "is") || is_name(t, "not"));
    return is_op(t, "[") || is_op(t, "{") || is_op(t, "-");
}

static node *p_filters(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, "|")) {
            P->i++;
            node *f = mk(P, N_FILTER, cur(P)->pos);
            f->name = expect_name(P);
            f->a = n;
            if (is_op(cur(P), "(")) p_args(P, f);
            n = f;
        } else if (is_name(t, "is")) {
            P->i++;
            node *f = mk(P, N_TEST, cur(P)->pos);
            if (is_name(cur(P), "not")) {
                f->neg = 1;
                P->i++;
            }
            tok *nt = cur(P);
            if (nt->k == T_NAME) f->name = expect_name(P);
            else if (is_name(nt, "none")) f->name = "none";
            else kvg_jx_fail(P->x, nt->pos, "expected a test name, got %s", tok_desc(P, nt));
            f->a = n;
            if (is_op(cur(P), "(")) p_args(P, f);
            else if (starts_test_arg(cur(P))) nl_push(P->x, &f->kids, p_unary(P, 0));
            n = f;
        } else {
            return n;
        }
    }
}

static node *p_unary(parser *P, int with_filter) {
    tok *t = cur(P);
    node *n;
    enter(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        n = mk(P, N_NEG, t->pos);
        n->a = p_unary(P, 0);
        if (is_op(t, "+")) n = n->a;
    } else {
        n = p_primary(P);
    }
    n = p_postfix(P, n);
    if (with_filter) n = p_filters(P, n);
    P->depth--;
    return n;
}

static node *bin(parser *P, const tok *t, node *a, node *b) {
    node *n = mk(P, N_BIN, t->pos);
    n->name = kvg_jx_cstr(P->x, t->p, t->n);
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *P) {
    node *n = p_unary(P, 1);
    while (is_op(cur(P), "**")) {
        tok *t = cur(P);
        P->i++;
        n = bin(P, t, n, p_unary(P, 1));
    }
    return n;
}
static node *p_math2(parser *P) {
    node *n = p_pow(P);
    for (;;) {
        tok *t = cur(P);
        if (!(is_op(t, "*") || is_op(t, "/") || is_op(t, "//") || is_op(t, "%"))) return n;
        P->i++;
        n = bin(P, t, n, p_pow(P));
    }
}
static node *p_concat(parser *P) {
    node *n = p_math2(P);
    while (is_op(cur(P), "~")) {
        tok *t = cur(P);
        P->i++;
        n = bin(P, t, n, p_math2(P));
    }
    return n;
}
static node *p_math1(parser *P) {
    node *n = p_concat(P);
    for (;;) {
        tok *t = cur(P);
        if (!(is_op(t, "+") || is_op(t, "-"))) return n;
        P->i++;
        n = bin(P, t, n, p_concat(P));
    }
}
static node *p_compare(parser *P) {
    node *n = p_math1(P);
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, "<=") || is_op(t, ">") ||
            is_op(t, ">=") || is_name(t, "in")) {
            P->i++;
            n = bin(P, t, n, p_math1(P));
        } else if (is_name(t, "not") && is_name(&P->t[P->i + 1], "in")) {
            P->i += 2;
            node *b = mk(P, N_BIN, t->pos);
            b->name = "not in";
            b->a = n;
            b->b = p_math1(P);
            n = b;
        } else {
            return n;
        }
    }
}
static node *p_not(parser *P) {
    tok *t = cur(P);
    if (is_name(t, "not")) {
        P->i++;
        enter(P);
        node *n = mk(P, N_NOT, t->pos);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}
static node *p_and(parser *P) {
    node *n = p_not(P);
    while (is_name(cur(P), "and")) {
        node *a = mk(P, N_AND, cur(P)->pos);
        P->i++;
        a->a = n;
        a->b = p_not(P);
        n = a;
    }
    return n;
}
static node *p_or(parser *P) {
    node *n = p_and(P);
    while (is_name(cur(P), "or")) {
        node *o = mk(P, N_OR, cur(P)->pos);
        P->i++;
        o->a = n;
        o->b = p_and(P);
        n = o;
    }
    return n;
}
static node *p_expr(parser *P) {
    enter(P);
    node *n = p_or(P);
    while (is_name(cur(P), "if")) {
        node *c = mk(P, N_COND, cur(P)->pos);
        P->i++;
        c->a = p_or(P); /* condition */
        c->b = n;       /* then */
        if (is_name(cur(P), "else")) {
            P->i++;
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

static void expect_end(parser *P) {
    if (cur(P)->k != T_BEND) kvg_jx_fail(P->x, cur(P)->pos, "expected '%%}', got %s", tok_desc(P, cur(P)));
    P->i++;
}

/* Parses statements until a {% name %} in `stops` (returned, the tag's name consumed) or EOF. */
static const char *p_body(parser *P, nlist *body, const char *const *stops);

static node *p_target(parser *P) {
    tok *t = cur(P);
    node *n = mk(P, N_NAME, t->pos);
    n->name = expect_name(P);
    if (is_op(cur(P), ".")) {
        P->i++;
        node *a = mk(P, N_ATTR, cur(P)->pos);
        a->a = n;
        a->name = expect_name(P);
        return a;
    }
    return n;
}

static node *p_stmt(parser *P, const tok *begin) {
    tok *t = cur(P);
    if (t->k != T_NAME) kvg_jx_fail(P->x, t->pos, "expected a statement name, got %s", tok_desc(P, t));
    if (is_name(t, "if")) {
        P->i++;
        node *n = mk(P, N_IF, begin->pos);
        node *br = mk(P, N_BODY, t->pos);
        br->a = p_expr(P);
        expect_end(P);
        for (;;) {
            static const char *const stops[] = {"elif", "else", "endif", NULL};
            nl_push(P->x, &n->kids, br);
            size_t at = cur(P)->pos;
            const char *stop = p_body(P, &br->kids, stops);
            if (!stop) kvg_jx_fail(P->x, begin->pos, "'if' is never closed (expected 'endif')");
            if (strcmp(stop, "endif") == 0) {
                expect_end(P);
                return n;
            }
            br = mk(P, N_BODY, at);
            if (strcmp(stop, "elif") == 0) br->a = p_expr(P);
            expect_end(P);
        }
    }
    if (is_name(t, "for")) {
        P->i++;
        node *n = mk(P, N_FOR, begin->pos);
        do {
            node *nm = mk(P, N_NAME, cur(P)->pos);
            nm->name = expect_name(P);
            nl_push(P->x, &n->kids2, nm); /* targets, moved below */
        } while (is_op(cur(P), ",") && (P->i++, 1));
        if (!is_name(cur(P), "in")) kvg_jx_fail(P->x, cur(P)->pos, "expected 'in', got %s", tok_desc(P, cur(P)));
        P->i++;
        n->a = p_or(P); /* the iterable: an inline 'if' filters */
        if (is_name(cur(P), "if")) {
            P->i++;
            n->b = p_expr(P);
        }
        if (is_name(cur(P), "recursive")) kvg_jx_fail(P->x, cur(P)->pos, "recursive loops are not supported");
        expect_end(P);
        node *targets = mk(P, N_LIST, t->pos);
        targets->kids = n->kids2;
        n->c = targets;
        n->kids2 = (nlist){0};
        static const char *const stops[] = {"else", "endfor", NULL};
        const char *stop = p_body(P, &n->kids, stops);
        if (!stop) kvg_jx_fail(P->x, begin->pos, "'for' is never closed (expected 'endfor')");
        expect_end(P);
        if (strcmp(stop, "else") == 0) {
            static const char *const stops2[] = {"endfor", NULL};
            if (!p_body(P, &n->kids2, stops2))
                kvg_jx_fail(P->x, begin->pos, "'for' is never closed (expected 'endfor')");
            expect_end(P);
        }
        return n;
    }
    if (is_name(t, "set")) {
        P->i++;
        node *n = mk(P, N_SET, begin->pos);
        node *tg = p_target(P);
        if (is_op(cur(P), ",")) {
            node *l = mk(P, N_LIST, tg->pos);
            nl_push(P->x, &l->kids, tg);
            while (is_op(cur(P), ",")) {
                P->i++;
                nl_push(P->x, &l->kids, p_target(P));
            }
            tg = l;
        }
        n->a = tg;
        if (cur(P)->k == T_BEND && tg->kind == N_NAME) {
            P->i++;
            n->kind = N_SETBLOCK;
            static const char *const stops[] = {"endset", NULL};
            if (!p_body(P, &n->kids, stops)) kvg_jx_fail(P->x, begin->pos, "'set' is never closed (expected 'endset')");
            expect_end(P);
            return n;
        }
        expect_op(P, "=");
        n->b = p_expr(P);
        if (is_op(cur(P), ",")) { /* set a = 1, 2 */
            node *l = mk(P, N_LIST, n->b->pos);
            nl_push(P->x, &l->kids, n->b);
            while (is_op(cur(P), ",")) {
                P->i++;
                nl_push(P->x, &l->kids, p_expr(P));
            }
            n->b = l;
        }
        expect_end(P);
        return n;
    }
    if (is_name(t, "macro")) {
        P->i++;
        node *n = mk(P, N_MACRO, begin->pos);
        n->name = expect_name(P);
        expect_op(P, "(");
        while (!is_op(cur(P), ")")) {
            node *pm = mk(P, N_KWARG, cur(P)->pos);
            pm->name = expect_name(P);
            if (is_op(cur(P), "=")) {
                P->i++;
                pm->a = p_expr(P);
            }
            nl_push(P->x, &n->kids2, pm);
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, ")");
        expect_end(P);
        static const char *const stops[] = {"endmacro", NULL};
        if (!p_body(P, &n->kids, stops)) kvg_jx_fail(P->x, begin->pos, "'macro' is never closed (expected 'endmacro')");
        if (cur(P)->k == T_NAME) P->i++; /* {% endmacro name %} */
        expect_end(P);
        return n;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        P->i++;
        node *n = mk(P, is_name(t, "break") ? N_BREAK : N_CONTINUE, begin->pos);
        expect_end(P);
        return n;
    }
    if (is_name(t, "generation")) { /* transformers' assistant-mask marker: renders its body */
        P->i++;
        expect_end(P);
        node *n = mk(P, N_BODY, begin->pos);
        static const char *const stops[] = {"endgeneration", NULL};
        if (!p_body(P, &n->kids, stops)) kvg_jx_fail(P->x, begin->pos, "'generation' is never closed");
        expect_end(P);
        return n;
    }
    kvg_jx_fail(P->x, t->pos, "unknown statement '%.*s'", (int)t->n, t->p);
}

static const char *p_body(parser *P, nlist *body, const char *const *stops) {
    enter(P);
    for (;;) {
        tok *t = cur(P);
        if (t->k == T_EOF) {
            P->depth--;
            return NULL;
        }
        if (t->k == T_TEXT) {
            node *n = mk(P, N_TEXT, t->pos);
            n->lit = mk_str(kvg_jstr_new(P->x, t->p, t->n, NULL));
            nl_push(P->x, body, n);
            P->i++;
        } else if (t->k == T_VBEGIN) {
            P->i++;
            node *n = mk(P, N_OUT, t->pos);
            n->a = p_expr(P);
            if (cur(P)->k != T_VEND) kvg_jx_fail(P->x, cur(P)->pos, "expected '}}', got %s", tok_desc(P, cur(P)));
            P->i++;
            nl_push(P->x, body, n);
        } else if (t->k == T_BBEGIN) {
            tok *nm = &P->t[P->i + 1];
            for (int k = 0; stops && stops[k]; k++)
                if (is_name(nm, stops[k])) {
                    P->i += 2;
                    P->depth--;
                    return stops[k];
                }
            if (nm->k == T_NAME && (strncmp(nm->p, "end", 3) == 0 || is_name(nm, "elif") || is_name(nm, "else")))
                kvg_jx_fail(P->x, nm->pos, "unexpected '%.*s'", (int)nm->n, nm->p);
            P->i++;
            nl_push(P->x, body, p_stmt(P, t));
        } else {
            kvg_jx_fail(P->x, t->pos, "unexpected %s", tok_desc(P, t));
        }
    }
}

bool kvg_jinja_parse(const char *src, size_t len, kvg_jinja **out, char *msg, size_t msg_size) {
    *out = NULL;
    kvg_jinja *t = kvg_calloc(1, sizeof *t);
    char *copy = kvg_malloc(len + 1);
    if (!t || !copy) {
        kvg_free(t);
        kvg_free(copy);
        snprintf(msg, msg_size, "out of memory");
        return false;
    }
    memcpy(copy, src, len);
    copy[len] = 0;
    jx x = {.msg = msg, .msg_size = msg_size, .src = copy, .src_len = len};
    if (setjmp(x.jb)) {
        kvg_jx_free(&x);
        kvg_free(copy);
        kvg_free(t);
        return false;
    }
    lexer L = {.x = &x};
    kvg_jinja_lex(&L);
    parser P = {.x = &x, .t = L.v};
    node *root = mk(&P, N_BODY, 0);
    if (p_body(&P, &root->kids, NULL) == NULL && cur(&P)->k != T_EOF)
        kvg_jx_fail(&x, cur(&P)->pos, "unexpected %s", tok_desc(&P, cur(&P)));
    t->blocks = x.blocks;
    t->bigs = x.bigs;
    t->root = root;
    t->src = copy;
    t->src_len = len;
    *out = t;
    return true;
}

void kvg_jinja_free(kvg_jinja *t) {
    if (!t) return;
    kvg_jx_free_all(t->blocks);
    kvg_jx_free_all(t->bigs);
    kvg_free(t->src);
    kvg_free(t);
}
