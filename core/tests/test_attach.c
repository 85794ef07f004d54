/* test_attach.c: state hung on a model by the layers above it (kvg_model_attach): one value per
 * key, the winner of a race returned to every thread, values freed last attached first. */
#include <string.h>
#include "kvg_model.h"
#include "kvg_platform.h"
#include "testutil.h"

static char freed[8];
static int n_freed;

static void note_free(void *value) {
    if (n_freed < (int)sizeof freed) freed[n_freed] = *(char *)value;
    n_freed++;
}

static const kvg_attach_key key_a = {"a", note_free};
static const kvg_attach_key key_b = {"b", note_free};
static const kvg_attach_key key_c = {"c", note_free};
static const kvg_attach_key key_plain = {"plain", NULL};

static void order_of_frees(void) {
    kvgen_model *m = calloc(1, sizeof *m);
    static char a = 'a', b = 'b', c = 'c', a2 = 'A', plain = 'p';
    CHECK(kvg_model_attached(m, &key_a) == NULL);
    CHECK(kvg_model_attach(m, &key_a, &a) == &a);
    CHECK(kvg_model_attach(m, &key_b, &b) == &b);
    CHECK(kvg_model_attach(m, &key_a, &a2) == &a); /* taken: the value there is returned */
    CHECK(kvg_model_attach(m, &key_plain, &plain) == &plain);
    CHECK(kvg_model_attach(m, &key_c, &c) == &c);
    CHECK(kvg_model_attached(m, &key_a) == &a);
    CHECK(kvg_model_attached(m, &key_b) == &b);
    CHECK(kvg_model_attached(m, &key_c) == &c);
    CHECK(kvg_model_attached(m, &key_plain) == &plain);
    /* a key is its address: the same name elsewhere is another key */
    static const kvg_attach_key other_a = {"a", note_free};
    CHECK(kvg_model_attached(m, &other_a) == NULL);
    n_freed = 0;
    kvg_model_detach_all(m);
    CHECKF(n_freed == 3 && memcmp(freed, "cba", 3) == 0, "%d freed: %.3s", n_freed, freed);
    CHECK(kvg_model_attached(m, &key_a) == NULL);
    kvg_model_detach_all(m); /* twice: nothing left to free */
    CHECK(n_freed == 3);
    free(m);
}

#define N_THREADS 8
#define N_KEYS 64

static kvg_attach_key race_keys[N_KEYS];
static int n_race_freed;

static void race_free(void *value) {
    (void)value;
    __atomic_add_fetch(&n_race_freed, 1, __ATOMIC_RELAXED);
}

typedef struct racer {
    kvgen_model *m;
    int *go;
    int mine[N_KEYS];    /* the values this thread offers */
    void *got[N_KEYS];   /* what attach returned */
    void *found[N_KEYS]; /* what a lookup saw right after */
} racer;

static void *race(void *arg) {
    racer *r = arg;
    while (!__atomic_load_n(r->go, __ATOMIC_ACQUIRE)) kvg_thread_yield();
    for (int k = 0; k < N_KEYS; k++) {
        r->got[k] = kvg_model_attach(r->m, &race_keys[k], &r->mine[k]);
        r->found[k] = kvg_model_attached(r->m, &race_keys[k]);
    }
    return NULL;
}

static void the_race(void) {
    for (int k = 0; k < N_KEYS; k++) race_keys[k] = (kvg_attach_key){"race", race_free};
    for (int round = 0; round < 20; round++) {
        kvgen_model *m = calloc(1, sizeof *m);
        static racer rs[N_THREADS];
        kvg_thread t[N_THREADS];
        int go = 0;
        for (int i = 0; i < N_THREADS; i++) {
            memset(&rs[i], 0, sizeof rs[i]);
            rs[i].m = m;
            rs[i].go = &go;
            CHECK(kvg_thread_create(&t[i], race, &rs[i]) == 0);
        }
        __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < N_THREADS; i++) kvg_thread_join(&t[i]);
        for (int k = 0; k < N_KEYS; k++) {
            void *winner = kvg_model_attached(m, &race_keys[k]);
            int n_won = 0;
            for (int i = 0; i < N_THREADS; i++) {
                CHECK(rs[i].got[k] == winner);
                CHECK(rs[i].found[k] == winner);
                n_won += winner == &rs[i].mine[k];
            }
            CHECKF(n_won == 1, "key %d: %d threads' values attached", k, n_won);
        }
        n_race_freed = 0;
        kvg_model_detach_all(m);
        CHECKF(n_race_freed == N_KEYS, "%d values freed, %d keys", n_race_freed, N_KEYS);
        free(m);
    }
}

int main(void) {
    order_of_frees();
    the_race();
    return tu_finish("test_attach");
}
