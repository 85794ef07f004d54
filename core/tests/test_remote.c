/* test_remote.c: remote models against faults a real server does not produce on demand, served
 * by a small HTTP stub on 127.0.0.1 inside the test: a malformed event, a reply that drips a
 * byte at a time, a reply cut off before its finish, a rate limit answered by a retry, a server
 * that accepts and says nothing, an error body, a stop string split across events, many
 * concurrent jobs, sentences for soft_max_tokens, a server that refuses every request (501) or
 * is always busy (503), and one that echoes the credentials it was sent. Also the load errors
 * (no server, bad options, the timeout as a bound on the whole load). Nothing waits on the
 * clock to decide an outcome: the stub's replies that never end last until kvgen closes the
 * connection, and the test waits for states the stub reports, with only generous deadlines
 * against a hang. The real server's behaviour is spec/remote_spec.lua's. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "kvg_remote.h"
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
enum mode {
    M_OK, M_MALFORMED, M_DRIP, M_TRUNCATED, M_RATE_LIMIT, M_SILENT, M_ERROR, M_SPLIT_STOP, M_LONG, M_SHIFTED,
    M_NOT_IMPLEMENTED, /* every request but the model list: HTTP 501 */
    M_BUSY,            /* every request, the model list too: HTTP 503 */
    M_SILENT_ALL,      /* every request, the model list too: nothing until kvgen closes */
    M_SENTENCES,       /* a reply of ten events, two sentences */
    M_ONE_EVENT,       /* the same reply as one event */
    M_ECHO_SECRET      /* HTTP 500 whose message repeats the request's credentials */
};
static _Atomic int g_mode;
static atomic_int g_requests, g_rate_limited;
static atomic_int g_long_started, g_long_closed; /* M_LONG: replies begun, and ended by kvgen closing */
static atomic_int g_silent_closed;                /* M_SILENT*: waits ended by kvgen closing */

#define SENTENCES "Mr. Smith paid 3.14 gold e.g. today. Then he left."

static int send_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}
static int send_str(int fd, const char *s) { return send_all(fd, s, strlen(s)); }

static int event(int fd, const char *text, const char *finish) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "data: {\"choices\":[{\"index\":0,\"text\":\"%s\",\"finish_reason\":%s%s%s}]}\n\n", text,
             finish ? "\"" : "", finish ? finish : "null", finish ? "\"" : "");
    return send_str(fd, buf);
}

/* Waits (at most a generous minute, against a hang) until *v reaches want. */
static int wait_count(atomic_int *v, int want) {
    for (int i = 0; i < 60000 && atomic_load(v) < want; i++) nap_ms(1);
    return atomic_load(v) >= want;
}

/* Says nothing until the client closes the connection (a generous cap against a hang). */
static void wait_for_close(int fd) {
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[256];
    while (recv(fd, b, sizeof b, 0) > 0) {
    }
    atomic_fetch_add(&g_silent_closed, 1);
}

static void json_reply(int fd, const char *status, const char *body) {
    char head[256];
    snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             status, strlen(body));
    send_str(fd, head);
    send_str(fd, body);
}
static int g_listen;
static int g_port;

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
    if (mode == M_BUSY) {
        json_reply(fd, "503 Service Unavailable", "{\"error\":{\"message\":\"the stub is busy\"}}");
    } else if (mode == M_SILENT_ALL) {
        wait_for_close(fd);
    } else if (mode == M_ECHO_SECRET) {
        /* a server that names what it was sent: the Authorization header and the password */
        char auth[256] = "(none)";
        const char *h = strstr(req, "Authorization: ");
        if (h) {
            h += 15;
            size_t k = strcspn(h, "\r\n\"\\");
            if (k >= sizeof auth) k = sizeof auth - 1;
            memcpy(auth, h, k);
            auth[k] = 0;
        }
        char body[600];
        snprintf(body, sizeof body, "{\"error\":{\"message\":\"refused %s for user:s3cretpw\"}}", auth);
        json_reply(fd, "500 Internal Server Error", body);
    } else if (strncmp(req, "GET /v1/models", 14) == 0) {
        const char *body = "{\"object\":\"list\",\"data\":[{\"id\":\"stub-model\"}]}";
        char head[256];
        snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 strlen(body));
        send_str(fd, head);
        send_str(fd, body);
    } else if (mode == M_NOT_IMPLEMENTED) {
        json_reply(fd, "501 Not Implemented", "{\"error\":{\"message\":\"the stub does not do that\"}}");
    } else if (strstr(req, "\"echo\":true")) {
        echo_reply(fd, req, mode);
    } else if (mode == M_RATE_LIMIT && atomic_fetch_add(&g_rate_limited, 1) == 0) {
        send_str(fd, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 41\r\n\r\n"
                     "{\"error\":{\"message\":\"slow down, please\"}}");
    } else if (mode == M_SILENT) {
        wait_for_close(fd);
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
        } else if (mode == M_LONG) { /* ticks until kvgen closes the connection (an hour at most) */
            atomic_fetch_add(&g_long_started, 1);
            int i = 0;
            while (i < 360000 && event(fd, " tick", NULL) == 0) {
                nap_ms(10);
                i++;
            }
            if (i < 360000) atomic_fetch_add(&g_long_closed, 1);
        } else if (mode == M_SENTENCES) {
            static const char *const words[] = {"Mr.", " Smith", " paid", " 3.14", " gold", " e.g.", " today.",
                                                " Then", " he", " left."};
            for (int i = 0; i < 10; i++) event(fd, words[i], NULL);
            event(fd, "", "stop");
            send_str(fd, "data: [DONE]\n\n");
        } else if (mode == M_ONE_EVENT) {
            event(fd, SENTENCES, "stop");
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

/* A remote session file's JSON: the text kvgen has always written (sampler fractions as %.15g
 * when that reads back within a relative DBL_EPSILON, else %.17g: 0.9f is 0.899999976158142),
 * and texts written before (raw bytes that are not UTF-8 in a message, text after the value)
 * restore and write back the same. */
static void test_session_json(void) {
    static const char chat[] =
        "{\"format\":\"kvgen remote session\",\"version\":1,\"model\":\"smol-\\\"model\\\"\",\"mode\":\"chat\","
        "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\\n\\u0001\"},{\"role\":\"user\",\"content\":"
        "\"h\xc3\xa9llo \xf0\x9f\x98\x80\"}],\"sampler\":{\"seed\":\"18446744073709551614\",\"temperature\":"
        "0.10000000149011612,\"top_k\":41,\"top_p\":0.699999988079071,\"min_p\":0.949999988079071,\"repeat_penalty\":"
        "1.1000000238418579,\"frequency_penalty\":-0.05000000074505806,\"presence_penalty\":1.2999998855178774e-09,"
        "\"penalty_window\":64}}";
    kvgen_error err = {0};
    kvg_rhist *h = kvg_rhist_new();
    CHECK(h && kvg_rhist_add_message(h, "system", "Be brief.\n\x01", 11, "t", &err) == KVGEN_OK &&
          kvg_rhist_add_message(h, "user", "h\xc3\xa9llo \xf0\x9f\x98\x80", 11, "t", &err) == KVGEN_OK);
    kvgen_sampler_desc sp = {.seed = 18446744073709551614ull, .temperature = 0.1f, .top_k = 41, .top_p = 0.7f,
                             .min_p = 0.95f, .repeat_penalty = 1.1f, .frequency_penalty = -0.05f,
                             .presence_penalty = 1.3f * 1e-9f, .penalty_window = 64};
    size_t n = 0;
    char *t = h ? kvg_rhist_to_json(h, &sp, "smol-\"model\"", &n) : NULL;
    CHECKF(t && n == strlen(chat) && strcmp(t, chat) == 0, "%s", t ? t : "(null)");
    kvg_free(t);
    kvg_rhist_free(h);
    /* 0.9f and a text session with a byte that is not UTF-8, followed by a NUL the length counts */
    static const char text[] = "{\"format\":\"kvgen remote session\",\"version\":1,\"model\":\"m\",\"mode\":\"text\","
                               "\"prompt\":\"caf\xc3\xa9 \xff\",\"sampler\":{\"seed\":\"5\",\"temperature\":"
                               "0.899999976158142,\"top_k\":0,\"top_p\":1,\"min_p\":0,\"repeat_penalty\":1,"
                               "\"frequency_penalty\":0,\"presence_penalty\":-0,\"penalty_window\":0}}";
    kvgen_sampler_desc back;
    CHECKF(kvg_rhist_from_json(text, sizeof text, &h, &back, NULL, "t", &err) == KVGEN_OK, "%s", err.message);
    if (h) {
        CHECK(back.temperature == 0.9f && back.seed == 5 && back.top_p == 1);
        t = kvg_rhist_to_json(h, &back, "m", &n);
        CHECKF(t && n == sizeof text - 1 && strcmp(t, text) == 0, "%s", t ? t : "(null)");
        kvg_free(t);
        kvg_rhist_free(h);
    }
    char bom[sizeof text + 3] = "\xef\xbb\xbf"; /* a byte order mark before it */
    memcpy(bom + 3, text, sizeof text);
    CHECKF(kvg_rhist_from_json(bom, sizeof bom - 1, &h, &back, NULL, "t", &err) == KVGEN_OK, "%s", err.message);
    kvg_rhist_free(h);
    static const char cut[] = "{\"format\":\"kvgen remote session\",\"mode\":\"chat\"";
    CHECK(kvg_rhist_from_json(cut, strlen(cut), &h, &back, NULL, "t", &err) == KVGEN_E_FORMAT &&
          contains(err.message, "does not parse"));
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
    /* a URL's password is never repeated */
    kvgen_model_desc creds = {.path = "http://user:s3cretpw@127.0.0.1:9/v1", .api_key = "sk-topsecret-key"};
    st = kvgen_model_load(&creds, &m, &err);
    CHECKF(st == KVGEN_E_NETWORK && !contains(err.message, "s3cretpw") && !contains(err.message, "sk-topsecret") &&
               contains(err.message, "http://user:***@127.0.0.1:9/v1/models"),
           "%s", err.message);
}

static kvgen_status load_count(const char *url, int timeout_ms, int *requests, kvgen_error *err) {
    kvgen_model *m = NULL;
    kvgen_model_desc d = {.path = url, .remote_timeout_ms = timeout_ms};
    int r0 = atomic_load(&g_requests);
    kvgen_status st = kvgen_model_load(&d, &m, err);
    *requests = atomic_load(&g_requests) - r0;
    kvgen_model_unload(m);
    return st;
}

/* remote_timeout_ms bounds the whole load: the model list, its retries and their backoffs */
static void test_load_timeout(const char *url) {
    kvgen_error err = {0};
    int n = 0;
    g_mode = M_BUSY; /* 503 each time: retried (after 250, then 500 ms) while the timeout allows */
    kvgen_status st = load_count(url, 60000, &n, &err);
    CHECKF(st == KVGEN_E_RATE_LIMITED && n == 3 && contains(err.message, "HTTP 503"), "%s, %d requests: %s",
           kvgen_status_name(st), n, err.message);
    st = load_count(url, 200, &n, &err); /* no backoff fits in 200 ms: one request */
    CHECKF(st == KVGEN_E_RATE_LIMITED && n == 1, "%s, %d requests: %s", kvgen_status_name(st), n, err.message);
    /* a server that accepts and never answers: the load gives up at the timeout, saying so */
    g_mode = M_SILENT_ALL;
    int closed = atomic_load(&g_silent_closed);
    double t0 = now_s();
    st = load_count(url, 200, &n, &err);
    double took = now_s() - t0;
    CHECKF(st == KVGEN_E_NETWORK && n == 1 && contains(err.message, "within 200 ms (remote_timeout_ms)") &&
               contains(err.message, "/v1/models"),
           "%s, %d requests: %s", kvgen_status_name(st), n, err.message);
    CHECKF(took < 0.2 * 30, "%.1f s", took); /* a bound against a hang, not a measurement */
    CHECK(wait_count(&g_silent_closed, closed + 1)); /* the connection was closed */
    g_mode = M_OK;
}

/* Runs a job to its final state (a generous deadline against a hang): the state. */
static kvgen_job_state job_wait(kvgen_job *j) {
    kvgen_job_state js = KVGEN_JOB_QUEUED;
    for (int i = 0; i < 60000; i++) {
        js = kvgen_job_poll(j, NULL, NULL);
        if (js == KVGEN_JOB_DONE || js == KVGEN_JOB_CANCELLED || js == KVGEN_JOB_FAILED) break;
        nap_ms(1);
    }
    return js;
}

/* A text generation on s: its status (err), text and finish. */
static kvgen_status gen_on(kvgen_session *s, const char *prompt, const kvgen_generate_desc *d, char *text, size_t cap,
                           kvgen_finish *fin, kvgen_error *err) {
    kvgen_gen *g = NULL;
    kvgen_status st = kvgen_gen_begin_text(s, prompt, strlen(prompt), d, &g, err);
    size_t n = 0;
    text[0] = 0;
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
    return st;
}

/* Every failed call leaves the session as it was: its history and length, whatever the entry
 * point (a generation from text, a chat turn, the blocking call, choice scoring, jobs), and
 * retried calls do not pile up. */
static void test_failures_leave_session(kvgen_model *m) {
    kvgen_error err = {0};
    char text[256];
    kvgen_finish fin;
    kvgen_session *s = NULL, *c = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    CHECK_OK(kvgen_session_create(m, NULL, &c, &err));
    if (!s || !c) return;
    g_mode = M_OK;
    CHECK_OK(gen_on(s, "Say", NULL, text, sizeof text, &fin, &err));
    CHECK(kvgen_session_length(s) == 3 + 11);
    CHECK_OK(kvgen_chat_add(c, "system", "Be brief.", &err));
    CHECK(kvgen_session_length(c) == 10);

    g_mode = M_NOT_IMPLEMENTED;
    for (int i = 0; i < 3; i++) {
        kvgen_status st = gen_on(s, " Again", NULL, text, sizeof text, &fin, &err);
        CHECKF(st == KVGEN_E_SERVER && fin == KVGEN_FINISH_ERROR && contains(err.message, "HTTP 501"), "%s: %s",
               kvgen_status_name(st), err.message);
        CHECKF(kvgen_session_length(s) == 14, "text, try %d: length %zu", i, kvgen_session_length(s));
        kvgen_gen *g = NULL;
        CHECK_OK(kvgen_chat_gen_begin(c, "user", "Hello", NULL, &g, &err));
        kvgen_gen_step step;
        st = g ? kvgen_gen_next(g, &step, &err) : KVGEN_E_INTERNAL;
        CHECKF(st == KVGEN_E_SERVER && step.finish == KVGEN_FINISH_ERROR, "%s", kvgen_status_name(st));
        kvgen_gen_end(g);
        CHECKF(kvgen_session_length(c) == 10, "chat, try %d: length %zu", i, kvgen_session_length(c));
    }
    size_t len = 0;
    kvgen_status st = kvgen_generate(s, NULL, text, sizeof text, &len, &fin, &err);
    CHECK(st == KVGEN_E_SERVER && fin == KVGEN_FINISH_ERROR && kvgen_session_length(s) == 14);
    const char *cands[] = {" yes", " no"};
    kvgen_choice ch[2];
    st = kvgen_session_choose(s, cands, 2, ch, &err);
    CHECK(st == KVGEN_E_SERVER && kvgen_session_length(s) == 14);

    /* a reply cut off after some text: the text was handed out, but the call failed */
    g_mode = M_TRUNCATED;
    st = gen_on(s, " More", NULL, text, sizeof text, &fin, &err);
    CHECKF(st == KVGEN_E_NETWORK && strcmp(text, "Hello there") == 0 && kvgen_session_length(s) == 14,
           "%s '%s' %zu", kvgen_status_name(st), text, kvgen_session_length(s));

    /* the same through jobs: text, a chat turn, and a reply cut off */
    g_mode = M_NOT_IMPLEMENTED;
    kvgen_job *j = NULL;
    kvgen_job_desc td = {.prompt = KVGEN_PROMPT_TEXT, .text = " Again"};
    CHECK_OK(kvgen_job_submit(s, &td, &j, &err));
    CHECK(j && job_wait(j) == KVGEN_JOB_FAILED && kvgen_session_length(s) == 14);
    kvgen_job_release(j);
    kvgen_job_desc cd = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Hello"};
    CHECK_OK(kvgen_job_submit(c, &cd, &j, &err));
    CHECK(j && job_wait(j) == KVGEN_JOB_FAILED && kvgen_session_length(c) == 10);
    kvgen_job_release(j);
    g_mode = M_TRUNCATED;
    CHECK_OK(kvgen_job_submit(s, &td, &j, &err));
    kvgen_job_state js = j ? job_wait(j) : KVGEN_JOB_QUEUED;
    CHECKF(js == KVGEN_JOB_FAILED && kvgen_session_length(s) == 14, "%s %zu", kvgen_job_state_name(js),
           kvgen_session_length(s));
    kvgen_job_release(j);
    g_mode = M_OK;
    kvgen_session_close(s);
    kvgen_session_close(c);
}

/* the chat read back from a remote session's history, and its last messages undone */
static void test_chat_readback(kvgen_model *m) {
    kvgen_error err = {0};
    kvgen_session *c = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &c, &err));
    if (!c) return;
    g_mode = M_OK;
    char text[256];
    kvgen_finish fin;
    CHECK_OK(kvgen_chat_add(c, "system", "Be brief.", &err));
    CHECK_OK(kvgen_chat_begin(c, "user", "Hello", &err));
    CHECK_OK(kvgen_generate(c, NULL, text, sizeof text, NULL, &fin, &err));
    kvgen_chat_message *msgs = NULL;
    size_t n = 0;
    CHECK_OK(kvgen_chat_messages(c, &msgs, &n, &err));
    CHECKF(n == 3 && strcmp(msgs[0].role, "system") == 0 && strcmp(msgs[0].content, "Be brief.") == 0 &&
               strcmp(msgs[1].role, "user") == 0 && strcmp(msgs[1].content, "Hello") == 0 &&
               strcmp(msgs[2].role, "assistant") == 0 && strcmp(msgs[2].content, text) == 0 && !msgs[2].tool_calls,
           "%zu messages", n);
    kvgen_chat_messages_free(msgs);
    size_t len = kvgen_session_length(c);
    CHECK(kvgen_chat_undo(c, 4, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(contains(err.message, "kvgen_chat_undo: n 4 is out of range [0, 3]"), "%s", err.message);
    CHECK(kvgen_session_length(c) == len);
    CHECK_OK(kvgen_chat_undo(c, 1, &err));
    CHECKF(kvgen_session_length(c) == 10 + 6, "length %zu", kvgen_session_length(c));
    CHECK_OK(kvgen_chat_undo(c, 2, &err));
    CHECK_OK(kvgen_chat_messages(c, &msgs, &n, &err));
    CHECK(n == 0 && !msgs && kvgen_session_length(c) == 0);
    /* a text session holds no messages */
    CHECK_OK(gen_on(c, "Say", NULL, text, sizeof text, &fin, &err));
    CHECK(kvgen_chat_undo(c, 1, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_close(c);
}

/* soft_max_tokens on a remote reply, one server event standing for one token: past the limit,
 * the reply ends at the first sentence end, as a local generation ends it */
static void test_soft_max(kvgen_model *m) {
    static const char first[] = "Mr. Smith paid 3.14 gold e.g. today.";
    static const struct {
        int mode, soft;
        const char *want;
        kvgen_finish fin;
    } cases[] = {
        {M_SENTENCES, 1, first, KVGEN_FINISH_SENTENCE},
        {M_SENTENCES, 7, first, KVGEN_FINISH_SENTENCE},   /* "today." is the 7th event */
        {M_SENTENCES, 8, SENTENCES, KVGEN_FINISH_STOP},   /* no sentence ends after the 8th */
        {M_ONE_EVENT, 1, first, KVGEN_FINISH_SENTENCE},   /* a whole reply in one event */
    };
    kvgen_error err = {0};
    char text[256];
    kvgen_finish fin;
    size_t len = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_mode = cases[i].mode;
        kvgen_generate_desc d = {.soft_max_tokens = cases[i].soft};
        kvgen_status st = run_gen(m, "Say", &d, text, sizeof text, &fin, &err, &len);
        CHECKF(st == KVGEN_OK && strcmp(text, cases[i].want) == 0 && fin == cases[i].fin &&
                   len == 3 + strlen(cases[i].want),
               "case %zu: %s '%s' %s %zu", i, kvgen_status_name(st), text, kvgen_finish_name(fin), len);
    }
    /* through a job */
    g_mode = M_SENTENCES;
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    kvgen_job *j = NULL;
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "Say", .gen = {.soft_max_tokens = 1}};
    if (s) CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
    kvgen_job_state js = j ? job_wait(j) : KVGEN_JOB_QUEUED;
    kvgen_job_info ji;
    kvgen_job_get_info(j, &ji);
    const char *jt = j ? kvgen_job_text(j, NULL) : NULL;
    CHECKF(js == KVGEN_JOB_DONE && ji.finish == KVGEN_FINISH_SENTENCE && jt && strcmp(jt, first) == 0, "%s %s '%s'",
           kvgen_job_state_name(js), kvgen_finish_name(ji.finish), jt ? jt : "");
    kvgen_job_release(j);
    kvgen_session_close(s);
    g_mode = M_OK;
}

/* Credentials in the URL and the API key appear in no message, even where the server repeats
 * them */
static void test_redaction(void) {
    char url[128], shown[128];
    snprintf(url, sizeof url, "http://user:s3cretpw@127.0.0.1:%d/v1", g_port);
    snprintf(shown, sizeof shown, "http://user:***@127.0.0.1:%d/v1", g_port);
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc d = {.path = url, .api_key = "sk-topsecret-key"};
    g_mode = M_ECHO_SECRET; /* the load's own request */
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_E_SERVER && contains(err.message, shown) && !contains(err.message, "s3cretpw") &&
               !contains(err.message, "sk-topsecret-key"),
           "%s", err.message);
    g_mode = M_OK;
    CHECK_OK(kvgen_model_load(&d, &m, &err));
    if (!m) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECKF(strcmp(info.device, shown) == 0, "%s", info.device);
    char desc[1024];
    kvgen_model_describe(m, desc, sizeof desc);
    CHECKF(!contains(desc, "s3cretpw") && contains(desc, shown), "%s", desc);
    char text[256];
    kvgen_finish fin;
    static const int modes[] = {M_ECHO_SECRET, M_TRUNCATED, M_MALFORMED};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        g_mode = modes[i];
        st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL);
        CHECKF(st != KVGEN_OK && contains(err.message, shown) && !contains(err.message, "s3cretpw") &&
                   !contains(err.message, "sk-topsecret-key"),
               "mode %d: %s", modes[i], err.message);
    }
    g_mode = M_ECHO_SECRET; /* choice scoring's requests */
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    kvgen_gen *g = NULL;
    if (s) CHECK_OK(kvgen_gen_begin_text(s, "Say", 3, NULL, &g, &err));
    kvgen_gen_end(g); /* the prompt stays, nothing sent */
    const char *cands[] = {" yes", " no"};
    kvgen_choice ch[2];
    st = kvgen_session_choose(s, cands, 2, ch, &err);
    CHECKF(st == KVGEN_E_SERVER && !contains(err.message, "s3cretpw") && !contains(err.message, "sk-topsecret-key"),
           "%s", err.message);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    g_mode = M_OK;
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
    test_session_json();
    if (start_stub() != 0) tu_skip("cannot listen on 127.0.0.1");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/", g_port); /* the trailing '/' is dropped */

    kvgen_model *m = NULL;
    kvgen_model_desc wrong = {.path = url, .remote_model = "other"};
    CHECK(kvgen_model_load(&wrong, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "'stub-model'"));
    test_load_timeout(url);
    test_redaction();
    /* the default timeout (a minute of silence): no outcome here waits on it */
    kvgen_model_desc md = {.path = url, .remote_max_requests = 4};
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
    kvgen_status st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_SERVER && fin == KVGEN_FINISH_ERROR && contains(err.message, "malformed event"), "%s %s: %s",
           kvgen_status_name(st), kvgen_finish_name(fin), err.message);

    /* one byte at a time: the events are put together across reads */
    g_mode = M_DRIP;
    CHECK_OK(run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL));
    CHECKF(strcmp(text, "Hello world!") == 0 && fin == KVGEN_FINISH_STOP, "'%s' %s", text, kvgen_finish_name(fin));

    /* cut off before a finish reason: an error, never a hang; the text received was handed out,
     * and the failed call left the session as it was */
    g_mode = M_TRUNCATED;
    st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_NETWORK && fin == KVGEN_FINISH_ERROR && contains(err.message, "without a finish"), "%s: %s",
           kvgen_status_name(st), err.message);
    CHECKF(strcmp(text, "Hello there") == 0 && len_after == 0, "'%s' %zu", text, len_after);

    /* 429 before any byte of the reply: retried after a backoff, then answered */
    g_mode = M_RATE_LIMIT;
    atomic_store(&g_rate_limited, 0);
    CHECK_OK(run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, NULL));
    CHECKF(strcmp(text, "Hello world") == 0 && atomic_load(&g_rate_limited) == 2, "'%s' %d", text,
           atomic_load(&g_rate_limited));

    /* a server that accepts and says nothing: the timeout ends it */
    kvgen_model *quick = NULL;
    kvgen_model_desc qd = {.path = url, .remote_timeout_ms = 300};
    CHECK_OK(kvgen_model_load(&qd, &quick, &err));
    g_mode = M_SILENT;
    int closed = atomic_load(&g_silent_closed);
    double t0 = now_s();
    st = quick ? run_gen(quick, "Say", NULL, text, sizeof text, &fin, &err, &len_after) : KVGEN_E_INTERNAL;
    double took = now_s() - t0;
    CHECKF(st == KVGEN_E_NETWORK && fin == KVGEN_FINISH_ERROR && contains(err.message, "300 ms (remote_timeout_ms)") &&
               len_after == 0,
           "%s: %s", kvgen_status_name(st), err.message);
    CHECKF(took < 0.3 * 30, "%.1f s", took); /* a bound against a hang, not a measurement */
    CHECK(wait_count(&g_silent_closed, closed + 1));
    kvgen_model_unload(quick);

    /* the server's own error message, mapped */
    g_mode = M_ERROR;
    st = run_gen(m, "Say", NULL, text, sizeof text, &fin, &err, &len_after);
    CHECKF(st == KVGEN_E_SERVER && contains(err.message, "HTTP 500") && contains(err.message, "out of order"), "%s",
           err.message);
    CHECK(len_after == 0); /* the failed call left the session as it was */

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
    int done = 0;
    for (int i = 0; i < NJ; i++) done += job_wait(jobs[i]) == KVGEN_JOB_DONE;
    CHECKF(done == NJ, "%d of %d jobs done", done, NJ);
    for (int i = 0; i < NJ; i++) {
        size_t n = 0;
        const char *t = kvgen_job_text(jobs[i], &n);
        CHECKF(t && strcmp(t, "Hello world") == 0, "job %d: '%s'", i, t ? t : "(null)");
        kvgen_job_release(jobs[i]);
        CHECK(kvgen_session_length(ss[i]) == 3 + 11);
    }

    /* cancel a reply that never ends (it ticks until the connection closes): once the stub is
     * sending it, the job ends cancelled and kvgen closes the connection */
    g_mode = M_LONG;
    kvgen_job *lj = NULL;
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "Count"};
    int started = atomic_load(&g_long_started);
    closed = atomic_load(&g_long_closed);
    CHECK_OK(kvgen_job_submit(ss[0], &jd, &lj, &err));
    CHECK(wait_count(&g_long_started, started + 1));
    kvgen_job_cancel(lj);
    kvgen_job_state js = lj ? job_wait(lj) : KVGEN_JOB_QUEUED;
    CHECKF(js == KVGEN_JOB_CANCELLED, "%s", kvgen_job_state_name(js));
    CHECK(wait_count(&g_long_closed, closed + 1));
    kvgen_job_release(lj);
    /* a session closed with a job running on the shared pool: the job is cancelled, nothing leaks */
    CHECK_OK(kvgen_job_submit(ss[1], &jd, &lj, &err));
    CHECK(wait_count(&g_long_started, started + 2));
    kvgen_session_close(ss[1]);
    ss[1] = NULL;
    CHECK(kvgen_job_poll(lj, NULL, NULL) == KVGEN_JOB_CANCELLED);
    kvgen_job_release(lj);
    CHECK(wait_count(&g_long_closed, closed + 2));

    test_failures_leave_session(m);
    test_chat_readback(m);
    test_soft_max(m);

    /* choice scoring from echoed log-probabilities: the tokens from the history's end on (a
     * session holding only "Say": the stub echoes short prompts) */
    g_mode = M_OK;
    const char *cands[] = {" yes", " no"};
    kvgen_choice ch[2];
    kvgen_session_close(ss[0]);
    CHECK_OK(kvgen_session_create(m, NULL, &ss[0], &err));
    kvgen_gen *pg = NULL;
    if (ss[0]) CHECK_OK(kvgen_gen_begin_text(ss[0], "Say", 3, NULL, &pg, &err));
    kvgen_gen_end(pg);
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
