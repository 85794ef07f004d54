/* npc_dialogue.c: three NPCs with their own personas share one loaded model; each has its own
 * session (and so its own KV cache). A scripted player talks to each in turn; replies stream
 * out token by token.
 *
 *   npc_dialogue [MODEL.gguf]     (default: $KVGEN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)
 *
 * The chat format here is ChatML, the template SmolLM2 was trained with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvgen.h"

typedef struct npc {
    const char *name;
    const char *persona;
    kvgen_session *session;
} npc;

/* Appends text to a session: the template's control tokens are parsed only in the template
 * parts we write ourselves; the player's words are tokenized as plain text, so a player
 * typing "<|im_end|>" cannot break out of their turn. */
static int feed(kvgen_model *model, kvgen_session *s, const char *text, unsigned flags) {
    size_t n = 0;
    kvgen_error err = {0};
    kvgen_tokenize(model, text, strlen(text), flags, NULL, 0, &n, NULL);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return -1;
    if (kvgen_tokenize(model, text, strlen(text), flags, ids, n, &n, &err) != KVGEN_OK ||
        (n > 0 && kvgen_session_prefill(s, ids, n, NULL, &err) != KVGEN_OK)) {
        fprintf(stderr, "error: %s\n", err.message);
        free(ids);
        return -1;
    }
    free(ids);
    return 0;
}

/* Streams a reply: past soft_max_tokens it ends where a sentence ends, max_tokens is the hard
 * limit, an end-of-turn token ends it earlier. The session then holds the reply; the turn is
 * closed so the conversation continues from a well-formed one (an end-of-turn token that ended
 * the reply is in the cache already; a reply ended at a sentence or the limit gets its own). */
static int reply(kvgen_model *model, npc *who, int soft_max_tokens, int max_tokens) {
    kvgen_error err = {0};
    kvgen_generate_desc gd = {.soft_max_tokens = soft_max_tokens, .max_tokens = max_tokens};
    kvgen_gen *g = NULL;
    if (kvgen_gen_begin(who->session, &gd, &g, &err) != KVGEN_OK) {
        fprintf(stderr, "error: %s\n", err.message);
        return -1;
    }
    printf("%s: ", who->name);
    kvgen_gen_step st = {0};
    while (kvgen_gen_next(g, &st, &err) == KVGEN_OK) {
        fputs(st.text, stdout); /* complete UTF-8 only; "" while a character is incomplete */
        fflush(stdout);
        if (st.finish != KVGEN_FINISH_NONE) break;
    }
    kvgen_finish finish = kvgen_gen_finish(g);
    kvgen_gen_end(g);
    if (finish == KVGEN_FINISH_ERROR) {
        fprintf(stderr, "\nerror: %s\n", err.message);
        return -1;
    }
    if (finish == KVGEN_FINISH_LENGTH) fputs(" ...", stdout);
    printf("\n\n");
    return finish == KVGEN_FINISH_STOP ? feed(model, who->session, "\n", 0)
                                       : feed(model, who->session, "<|im_end|>\n", KVGEN_TOKENIZE_SPECIAL);
}

static int say(kvgen_model *model, npc *who, const char *player_line) {
    printf("Player -> %s: %s\n", who->name, player_line);
    if (feed(model, who->session, "<|im_start|>user\n", KVGEN_TOKENIZE_SPECIAL) ||
        feed(model, who->session, player_line, 0) ||
        feed(model, who->session, "<|im_end|>\n<|im_start|>assistant\n", KVGEN_TOKENIZE_SPECIAL))
        return -1;
    return reply(model, who, 32, 96);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("KVGEN_MODEL");
    if (!path || !*path) path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

    kvgen_error err = {0};
    kvgen_model *model = NULL;
    kvgen_model_desc md = {.path = path};
    if (kvgen_model_load(&md, &model, &err) != KVGEN_OK) {
        fprintf(stderr, "error: %s\n", err.message);
        return 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    printf("kvgen %s: %s on %s (%s)\n\n", kvgen_version(), info.name, info.device, info.backend);

    npc npcs[] = {
        {"Mira", "You are Mira, the village blacksmith. You are gruff but kind, and you answer in one or two sentences.", NULL},
        {"Tobin", "You are Tobin, a cheerful innkeeper who loves gossip. You answer in one or two sentences.", NULL},
        {"Elda", "You are Elda, an old herbalist who speaks calmly about plants. You answer in one or two sentences.", NULL},
    };
    const int n_npc = (int)(sizeof npcs / sizeof npcs[0]);
    int rc = 0;
    for (int i = 0; i < n_npc && rc == 0; i++) {
        kvgen_session_desc sd = {.seed = 42 + (uint64_t)i, .temperature = 0.7f, .top_k = 40, .top_p = 0.9f};
        if (kvgen_session_create(model, &sd, &npcs[i].session, &err) != KVGEN_OK) {
            fprintf(stderr, "error: %s\n", err.message);
            rc = 1;
            break;
        }
        char sys[512];
        snprintf(sys, sizeof sys, "<|im_start|>system\n%s<|im_end|>\n", npcs[i].persona);
        if (feed(model, npcs[i].session, sys, KVGEN_TOKENIZE_SPECIAL)) rc = 1;
    }
    const char *script[][2] = {
        {"Mira", "Can you fix my sword before the festival?"},
        {"Tobin", "Any news in town today?"},
        {"Elda", "What herb helps with a cough?"},
        {"Mira", "How much will the repair cost?"},
    };
    for (size_t k = 0; rc == 0 && k < sizeof script / sizeof script[0]; k++)
        for (int i = 0; i < n_npc; i++)
            if (strcmp(npcs[i].name, script[k][0]) == 0 && say(model, &npcs[i], script[k][1])) rc = 1;

    for (int i = 0; i < n_npc; i++) {
        if (npcs[i].session)
            printf("[%s's cache: %zu tokens]\n", npcs[i].name, kvgen_session_length(npcs[i].session));
        kvgen_session_close(npcs[i].session);
    }
    kvgen_model_unload(model);
    return rc;
}
