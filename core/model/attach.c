/* attach.c: per-model state of the layers above the model (the jobs' worker, the grammar's
 * vocabulary trie, a remote model's connection), hung on the model under a key instead of as
 * fields of struct kvgen_model, so the model knows nothing of the layers that use it.
 * The layers above let go of the model here too (kvg_model_release): the last reference frees
 * it through the load's destroy hook, so no layer calls up into api.c to free it.
 *
 * The values form a list, newest first, whose head is swapped in with a compare-and-swap: a
 * reader walks it without a lock (a node never changes once it is in the list), and a writer
 * that lost the race to another writer looks again, so one value per key wins. */
#include "kvg_model.h"

typedef struct kvg_attached {
    const kvg_attach_key *key;
    void *value;
    struct kvg_attached *next; /* attached before this one */
} kvg_attached;

static void *find(const kvg_attached *a, const kvg_attach_key *key) {
    for (; a; a = a->next)
        if (a->key == key) return a->value;
    return NULL;
}

void *kvg_model_attached(const struct kvgen_model *m, const kvg_attach_key *key) {
    return find(__atomic_load_n(&m->attached, __ATOMIC_ACQUIRE), key);
}

void *kvg_model_attach(struct kvgen_model *m, const kvg_attach_key *key, void *value) {
    kvg_attached *head = __atomic_load_n(&m->attached, __ATOMIC_ACQUIRE);
    void *there = find(head, key);
    if (there) return there;
    kvg_attached *node = kvg_malloc(sizeof *node);
    if (!node) return NULL;
    *node = (kvg_attached){key, value, head};
    /* a failed swap loads the new head into node->next: look again in what was added since */
    while (!__atomic_compare_exchange_n(&m->attached, &node->next, node, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
        there = find(node->next, key);
        if (there) {
            kvg_free(node);
            return there;
        }
    }
    return value;
}

void kvg_model_detach_all(struct kvgen_model *m) {
    kvg_attached *a = m->attached;
    m->attached = NULL;
    while (a) { /* newest first: a value may use those attached before it */
        kvg_attached *next = a->next;
        if (a->key->free_value) a->key->free_value(a->value);
        kvg_free(a);
        a = next;
    }
}

void kvg_model_release(struct kvgen_model *m) {
    if (m && __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) == 0) m->destroy(m);
}
