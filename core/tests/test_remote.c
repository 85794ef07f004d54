/* test_remote.c: remote models against faults a real server does not produce on demand, served
 * by a small HTTP stub on 127.0.0.1 inside the test: a malformed event, a reply that drips a
 * byte at a time, a reply cut off before its finish, a rate limit answered by a retry, a server
 * that accepts and says nothing, an error body, a stop string split across events, and many
 * concurrent jobs. Also the load errors (no server, bad options). Each case is bounded in time.
 * The real server's behaviour is spec/remote_spec.lua's. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "testutil.h"

static int contains(const char *s, const char *what) { return s && strstr(s, what) != NULL; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the stub ---- */
enum mode { M_OK, M_MALFORMED, M_DRIP, M_TRUNCATED, M_RATE_LIMIT, M_SILENT, M_ERROR, M_SPLIT_STOP, M_LONG, M_SHIFTED };
static _Atomic int g_mode;
static atomic_int g_requests, g_rate_limited;
static int g_listen;
static int g_port;

static void send_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k;
        n -= (size_t)k;
    }
}
static void send_str(int fd, const char *s) { send_all(fd, s, strlen(s)); }

static void event(int fd, const char *text, const char *finish) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "data: {\"choices\":[{\"index\":0,\"text\":\"%s\",\"finish_reason\":%s%s%s}]}\n\n", text,
             finish ? "\"" : "", finish ? finish : "null", finish ? "\"" : "");
    send_str(fd, buf);
}

/* An echo with log-probabilities (choice scoring): one token per byte of the prompt, each -0.5
 * and the best of its position, then a generated "x" at -0.1. M_SHIFTED scores the generated
 * token as a server that uses the distribution after it would: not the best of its position. */
static void echo_reply(int fd, const char *req, int mode) {
    const char *p = strstr(req, "\"prompt\":\"");
    char prompt[512] = "";
    size_t n = 0;
    if (p)
        for (p += 10; *p && *p != '"' && n < sizeof prompt - 1; p++) prompt[n++] = *p;
    prompt[n] = 0;
    char body[16384];
    size_t k = 0;
    k += (size_t)snprintf(body + k, sizeof body - k, "{\"choices\":[{\"text\":\"%sx\",\"logprobs\":{\"tokens\":[",
                          prompt);
    for (size_t i = 0; i <= n; i++)
        k += (size_t)snprintf(body + k, sizeof body - k, "%s\"%c\"", i ? "," : "", i < n ? prompt[i] : 'x');
    k += (size_t)snprintf(body + k, sizeof body - k, "],\"text_offset\":[");
    for (size_t i = 0; i <= n; i++) k += (size_t)snprintf(body + k, sizeof body - k, "%s%zu", i ? "," : "", i);
    k += (size_t)snprintf(body + k, sizeof body - k, "],\"token_logprobs\":[null");
    for (size_t i = 1; i <= n; i++)
        k += (size_t)snprintf(body + k, sizeof body - k, ",%s", i < n ? "-0.5" : mode == M_SHIFTED ? "-3.0" : "-0.1");
    k += (size_t)snprintf(body + k, sizeof body - k, "],\"top_logprobs\":[null");
    for (size_t i = 1; i <= n; i++)
        k += (size_t)snprintf(body + k, sizeof body - k, ",%s",
                              i < n ? "{\"a\":-0.5}" : mode == M_SHIFTED ? "{\"y\":-0.05,\"x\":-3.0}" : "{\"x\":-0.1}");
    k += (size_t)snprintf(body + k, sizeof body - k, "]},\"finish_reason\":\"length\"}]}");
    char head[256];
    snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", k);
    send_str(fd, head);
    send_all(fd, body, k);
}

static const char *SSE_HEAD = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

static void *serve(void *arg) {
    int fd = (int)(intptr_t)arg;
    char req[65536];
    size_t n = 0;
    /* the request line, headers and (Content-Length) body */
    for (;;) {
        ssize_t k = recv(fd, req + n, sizeof req - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = 0;
        char *end = strstr(req, "\r\n\r\n");
        if (!end) continue;
        char *cl = strstr(req, "Content-Length:");
        if (!cl) cl = strstr(req, "content-length:");
        size_t want = cl ? (size_t)atol(cl + 15) : 0;
        if (n >= (size_t)(end + 4 - req) + want) break;
    }
    atomic_fetch_add(&g_requests, 1);
    int mode = g_mode;
    if (strncmp(req, "GET /v1/models", 14) == 0) {
        const char *body = "{\"object\":\"list\",\"data\":[{\"id\":\"stub-model\"}]}";
        char head[256];
        snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 strlen(body));
        send_str(fd, head);
        send_str(fd, body);
    } else if (strstr(req, "\"echo\":true")) {
        echo_reply(fd, req, mode);
    } else if (mode == M_RATE_LIMIT && atomic_fetch_add(&g_rate_limited, 1) == 0) {
        send_str(fd, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 41\r\n\r\n"
                     "{\"error\":{\"message\":\"slow down, please\"}}");
    } else if (mode == M_SILENT) {
        nap_ms(6000);
    } else if (mode == M_ERROR) {
        const char *body = "{\"error\":{\"message\":\"the stub is out of order\",\"type\":\"server_error\"}}";
        char head[256];
        snprintf(head, sizeof head, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                    "Content-Length: %zu\r\n\r\n", strlen(body));
        send_str(fd, head);
        send_str(fd, body);
    } else {
        send_str(fd, SSE_HEAD);
        if (mode == M_MALFORMED) {
            event(fd, "Hello", NULL);
            send_str(fd, "data: {\"choices\":[{\"text\": \"oops\n\n");
            nap_ms(200);
        } else if (mode == M_DRIP) {
            const char *ev = "data: {\"choices\":[{\"text\":\"Hello world\",\"finish_reason\":null}]}\n\n"
                             "data: {\"choices\":[{\"text\":\"!\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
            for (const char *p = ev; *p; p++) {
                send_all(fd, p, 1);
                nap_ms(2);
            }
        } else if (mode == M_TRUNCATED) {
            event(fd, "Hello", NULL);
            event(fd, " there", NULL);
        } else if (mode == M_SPLIT_STOP) {
            event(fd, "Hel", NULL);
            event(fd, "lo, wor", NULL);
            event(fd, "ld and more", NULL);
            event(fd, "", "stop");
            send_str(fd, "data: [DONE]\n\n");
        } else if (mode == M_LONG) {
            for (int i = 0; i < 400; i++) {
                event(fd, " tick", NULL);
                nap_ms(10);
            }
            event(fd, "", "length");
            send_str(fd, "data: [DONE]\n\n");
        } else { /* M_OK, M_RATE_LIMIT after the first */
            event(fd, "Hello", NULL);
            event(fd, " world", NULL);
            event(fd, "", "stop");
            send_str(fd, "data: [DONE]\n\n");
        }
    }
    close(fd);
    return NULL;
}

static void *acceptor(void *arg) {
    (void)arg;
    for (;;) {
        int fd = accept(g_listen, NULL, NULL);
        if (fd < 0) return NULL;
        pthread_t t;
        if (pthread_create(&t, NULL, serve, (void *)(intptr_t)fd) == 0) pthread_detach(t);
        else close(fd);
    }
}

static int start_stub(void) {
    g_listen = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(g_listen, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    if (bind(g_listen, (struct sockaddr *)&a, sizeof a) != 0 || listen(g_listen, 64) != 0) return -1;
    socklen_t len = sizeof a;
    getsockname(g_listen, (struct sockaddr *)&a, &len);
    g_port = ntohs(a.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, acceptor, NULL) != 0) return -1;
    pthread_detach(t);
    return 0;
}

/* ---- helpers ---- */

/* One generation on a fresh text session: its text, finish and status. */
static kvgen_status run_gen(kvgen_model *m, const char *prompt, const kvgen_generate_desc *d, char *text,
                            size_t cap, kvgen_finish *fin, kvgen_error *err, size_t *len_after) {
    kvgen_session *s = NULL;
    kvgen_status st = kvgen_session_create(m, NULL, &s, err);
    if (st != KVGEN_OK) return st;
    kvgen_gen *g = NULL;
    st = kvgen_gen_begin_text(s, prompt, strlen(prompt), d, &g, err);
    text[0] = 0;
    size_t n = 0;
    while (st == KVGEN_OK && kvgen_gen_finish(g) == KVGEN_FINISH_NONE) {
        kvgen_gen_step step;
        st = kvgen_gen_next(g, &step, err);
        if (step.len && n + step.len < cap) {
            memcpy(text + n, step.text, step.len);
            n += step.len;
            text[n] = 0;
        }
    }
    *fin = g ? kvgen_gen_finish(g) : KVGEN_FINISH_ERROR;
    kvgen_gen_end(g);
    if (len_after) *len_after = kvgen_session_length(s);
    kvgen_session_close(s);
    return st;
}

static void test_load_errors(void) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    double t0 = now_s();
    kvgen_model_desc none = {.path = "http://127.0.0.1:9/v1"}; /* nothing listens on port 9 */
    kvgen_status st = kvgen_model_load(&none, &m, &err);
    CHECKF(st == KVGEN_E_NETWORK && m == NULL && contains(err.message, "http://127.0.0.1:9/v1/models"), "%s: %s",
           kvgen_status_name(st), err.message);
    CHECKF(now_s() - t0 < 10, "a refused connection took %.1f s (retries are bounded)", now_s() - t0);
    kvgen_model_desc bad = {.path = "http://127.0.0.1:9/v1", .remote_max_requests = -2};
    CHECK(kvgen_model_load(&bad, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "remote_max_requests -2"));
    kvgen_model_desc key = {.path = "http://127.0.0.1:9/v1", .api_key = "a\nb"};
    CHECK(kvgen_model_load(&key, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "api_key"));
    CHECK(strcmp(kvgen_status_name(KVGEN_E_NETWORK), "network") == 0);
    CHECK(strcmp(kvgen_status_name(KVGEN_E_SERVER), "server") == 0);
    CHECK(strcmp(kvgen_status_name(KVGEN_E_RATE_LIMITED), "rate_limited") == 0);
}

int main(void) {
    kvgen_error err = {0};
    kvgen_model *probe = NULL;
    kvgen_model_desc off = {.path = "http://127.0.0.1:9/v1"};
    if (kvgen_model_load(&off, &probe, &err) == KVGEN_E_UNSUPPORTED) {
        CHECK(contains(err.message, "without remote models"));
        printf("remote models are not built in: %s\n", err.message);
        return tu_finish("test_remote");
    }
    test_load_errors();
    if (start_stub() != 0) tu_skip("cannot listen on 127.0.0.1");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/", g_port); /* the trailing '/' is dropped */

    kvgen_model *m = NULL;
    kvgen_model_desc wrong = {.path = url, .remote_model = "other"};
    CHECK(kvgen_model_load(&wrong, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "'stub-model'"));
    kvgen_model_desc md = {.path = url, .remote_timeout_ms = 1500, .remote_max_requests = 4};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) return tu_finish("test_remote");
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECK(strcmp(info.backend, "remote") == 0 && strcmp(info.name, "stub-model") == 0);

    char text[4096];
    kvgen_finish fin;
    size_t len_after = 0;
    g_mode = M_OK;
    CHECK_OK(run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after));
    CHECKF(strcmp(text, "Hello world") == 0 && fin == KVGEN_FINISH_STOP && len_after == 3 + 11, "'%s' %s %zu", text,
           kvgen_finish_name(fin), len_after);

    /* a malformed event ends the generation with the server's bytes named; the text before it stays */
    g_mode = M_MALFORMED;
    double t0 = now_s();
    kvgen_status st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_SERVER && fin == KVGEN_FINISH_ERROR && contains(err.message, "malformed event"), "%s %s: %s",
           kvgen_status_name(st), kvgen_finish_name(fin), err.message);
    CHECK(now_s() - t0 < 5);

    /* one byte at a time: the events are put together across reads */
    g_mode = M_DRIP;
    CHECK_OK(run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL));
    CHECKF(strcmp(text, "Hello world!") == 0 && fin == KVGEN_FINISH_STOP, "'%s' %s", text, kvgen_finish_name(fin));

    /* cut off before a finish reason: an error, never a hang; the text received is kept */
    g_mode = M_TRUNCATED;
    t0 = now_s();
    st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_NETWORK && fin == KVGEN_FINISH_ERROR && contains(err.message, "without a finish"), "%s: %s",
           kvgen_status_name(st), err.message);
    CHECKF(strcmp(text, "Hello there") == 0 && len_after == 3 + 11, "'%s' %zu", text, len_after);
    CHECK(now_s() - t0 < 5);

    /* 429 before any byte of the reply: retried after a backoff, then answered */
    g_mode = M_RATE_LIMIT;
    atomic_store(&g_rate_limited, 0);
    CHECK_OK(run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL));
    CHECKF(strcmp(text, "Hello world") == 0 && atomic_load(&g_rate_limited) == 2, "'%s' %d", text,
           atomic_load(&g_rate_limited));

    /* a server that accepts and says nothing: the timeout ends it */
    g_mode = M_SILENT;
    t0 = now_s();
    st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL);
    double took = now_s() - t0;
    CHECKF(st == KVGEN_E_NETWORK && fin == KVGEN_FINISH_ERROR && took < 5, "%s after %.1f s: %s",
           kvgen_status_name(st), took, err.message);

    /* the server's own error message, mapped */
    g_mode = M_ERROR;
    st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_SERVER && contains(err.message, "HTTP 500") && contains(err.message, "out of order"), "%s",
           err.message);
    CHECK(len_after == 3); /* nothing came: the history is the prompt alone */

    /* a stop string split across events: held back, never emitted, the text ends before it */
    g_mode = M_SPLIT_STOP;
    const char *stops[] = {"o, w"};
    kvgen_generate_desc sd = {.stop = stops, .n_stop = 1};
    CHECK_OK(run_gen(m, "Say", &sd, text, sizeof text, &fin, &err, &len_after));
    CHECKF(strcmp(text, "Hell") == 0 && fin == KVGEN_FINISH_STOP_STRING, "'%s' %s", text, kvgen_finish_name(fin));
    CHECK(len_after == 3 + 4 + 4); /* the text and the stop string, as a local session keeps its tokens */

    /* jobs: twelve at once through a pool of four requests; each ends with the stub's text */
    g_mode = M_OK;
    enum { NJ = 12 };
    kvgen_session *ss[NJ];
    kvgen_job *jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        CHECK_OK(kvgen_session_create(m, NULL, &ss[i], &err));
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "Say"};
        CHECK_OK(kvgen_job_submit(ss[i], &jd, &jobs[i], &err));
    }
    t0 = now_s();
    int done = 0;
    while (done < NJ && now_s() - t0 < 20) {
        done = 0;
        for (int i = 0; i < NJ; i++) done += kvgen_job_poll(jobs[i], NULL, NULL) == KVGEN_JOB_DONE;
        nap_ms(5);
    }
    CHECKF(done == NJ, "%d of %d jobs done", done, NJ);
    for (int i = 0; i < NJ; i++) {
        size_t n = 0;
        const char *t = kvgen_job_text(jobs[i], &n);
        CHECKF(t && strcmp(t, "Hello world") == 0, "job %d: '%s'", i, t ? t : "(null)");
        kvgen_job_release(jobs[i]);
        CHECK(kvgen_session_length(ss[i]) == 3 + 11);
    }

    /* cancel a long reply: the job ends cancelled at once, the connection closed */
    g_mode = M_LONG;
    kvgen_job *lj = NULL;
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "Count"};
    CHECK_OK(kvgen_job_submit(ss[0], &jd, &lj, &err));
    t0 = now_s();
    while (lj && kvgen_job_poll(lj, NULL, NULL) != KVGEN_JOB_GENERATING && now_s() - t0 < 5) nap_ms(2);
    nap_ms(100);
    kvgen_job_cancel(lj);
    kvgen_job_state js = KVGEN_JOB_QUEUED;
    while (lj && now_s() - t0 < 10 && (js = kvgen_job_poll(lj, NULL, NULL)) != KVGEN_JOB_CANCELLED &&
           js != KVGEN_JOB_DONE && js != KVGEN_JOB_FAILED)
        nap_ms(2);
    CHECKF(js == KVGEN_JOB_CANCELLED && now_s() - t0 < 3, "%s after %.2f s", kvgen_job_state_name(js), now_s() - t0);
    kvgen_job_release(lj);
    /* a session closed with a job running on the shared pool: the job is cancelled, nothing leaks */
    CHECK_OK(kvgen_job_submit(ss[1], &jd, &lj, &err));
    nap_ms(50);
    kvgen_session_close(ss[1]);
    ss[1] = NULL;
    CHECK(kvgen_job_poll(lj, NULL, NULL) == KVGEN_JOB_CANCELLED);
    kvgen_job_release(lj);

    /* choice scoring from echoed log-probabilities: the tokens from the history's end on */
    g_mode = M_OK;
    const char *cands[] = {" yes", " no"};
    kvgen_choice ch[2];
    CHECK_OK(kvgen_session_choose(ss[0], cands, 2, ch, &err));
    CHECKF(fabs(ch[0].logprob + 2.0) < 1e-9 && ch[0].n_tokens == 4 && fabs(ch[1].logprob + 1.5) < 1e-9 &&
               ch[1].n_tokens == 3 && fabs(ch[1].logprob_mean + 0.5) < 1e-9,
           "%g/%d %g/%d", ch[0].logprob, ch[0].n_tokens, ch[1].logprob, ch[1].n_tokens);
    g_mode = M_SHIFTED; /* a server scoring each token by the distribution after it is refused */
    st = kvgen_session_choose(ss[0], cands, 2, ch, &err);
    CHECKF(st == KVGEN_E_UNSUPPORTED && contains(err.message, "distribution after"), "%s: %s", kvgen_status_name(st),
           err.message);
    g_mode = M_OK;

    /* token-level calls are refused by name */
    int32_t tok = 1;
    st = kvgen_session_prefill(ss[0], &tok, 1, NULL, &err);
    CHECK(st == KVGEN_E_UNSUPPORTED && contains(err.message, "kvgen_session_prefill") && contains(err.message, "remote"));
    size_t nt = 0;
    CHECK(kvgen_tokenize(m, "hi", 2, 0, NULL, 0, &nt, &err) == KVGEN_E_UNSUPPORTED && contains(err.message, "remote"));
    kvgen_logit_bias b = {1, -1.0f};
    kvgen_sampler_desc sdb = {.bias = &b, .n_bias = 1};
    CHECK(kvgen_session_set_sampler(ss[0], &sdb, &err) == KVGEN_E_UNSUPPORTED);

    for (int i = 0; i < NJ; i++) kvgen_session_close(ss[i]);
    kvgen_model_unload(m);
    return tu_finish("test_remote");
}
