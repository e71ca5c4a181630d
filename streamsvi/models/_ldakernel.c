/* The LDA local step (streamsvi.models.lda), compiled: one document at a time.
 *
 * Same iteration, stopping rule, held topics and final check as the numpy
 * kernel LDA._fit_gamma (see the module docs of lda.py); only the order of
 * the floating-point sums differs. Per document, the exp E[log beta] rows of
 * its words are copied into a (words x live topics) buffer that stays in
 * cache for all its sweeps; holding a topic removes its column.
 *
 * With inv_t = 1/T < 1 it is the tempered (detAVI) local step of lda.py's
 * _fit_gamma_tempered; inv_t = 1 runs exactly the untempered code.
 *
 * Built by setup.py as an optional extension; without a C compiler the numpy
 * kernel runs instead. Buffers only (no numpy headers): every array argument
 * is C-contiguous, float64 or int64, as lda.py passes them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* psi(x) for x > 0: recurrence up to x >= 10, then the asymptotic series
 * ln x - 1/(2x) - sum_k B_2k / (2k x^2k) through k = 7 (error < 1e-16).
 * With want_exp, exp(psi(x) - s) instead, as x' exp(-1/(2x') - series - w - s)
 * (x' the shifted argument): one exp and no log. */
static inline double psi_or_exp(double x, double s, int want_exp)
{
    double w = 0.0;
    while (x < 10.0) {
        w += 1.0 / x;
        x += 1.0;
    }
    double z = 1.0 / (x * x);
    double y = z * (1.0 / 12 + z * (-1.0 / 120 + z * (1.0 / 252 + z * (-1.0 / 240
               + z * (1.0 / 132 + z * (-691.0 / 32760 + z * (1.0 / 12)))))));
    if (want_exp)
        return x * exp(-0.5 / x - y - w - s);
    return log(x) - 0.5 / x - y - w;
}

static double digamma_pos(double x) { return psi_or_exp(x, 0.0, 0); }

/* Sums with 16 independent partial sums (vectorised without reassociating any). */
static inline double dot(const double *a, const double *b, Py_ssize_t n)
{
    double acc[16] = {0.0};
    Py_ssize_t k = 0;
    for (; k + 16 <= n; k += 16)
        for (int u = 0; u < 16; u++)
            acc[u] += a[k + u] * b[k + u];
    double s = 0.0;
    for (; k < n; k++)
        s += a[k] * b[k];
    for (int u = 0; u < 16; u++)
        s += acc[u];
    return s;
}

/* Z[j] = sum_k th[k] buf[k L + j], 16 words at a time in registers. */
static inline void matvec_t(const double *buf, const double *th, Py_ssize_t nl, Py_ssize_t L,
                            double *Z)
{
    Py_ssize_t j = 0, kk;
    for (; j + 16 <= L; j += 16) {
        double acc[16] = {0.0};
        for (kk = 0; kk < nl; kk++) {
            const double t = th[kk];
            const double *r = buf + kk * L + j;
            for (int u = 0; u < 16; u++)
                acc[u] += t * r[u];
        }
        for (int u = 0; u < 16; u++)
            Z[j + u] = acc[u];
    }
    for (; j < L; j++) {
        double z = 0.0;
        for (kk = 0; kk < nl; kk++)
            z += th[kk] * buf[kk * L + j];
        Z[j] = z;
    }
}

typedef struct {
    const double *eb;            /* (rows, K) exp(E[log beta_kw] - m_w), word-major */
    Py_ssize_t K;
    const double *alpha;         /* (K,) */
    double tolK, eps, psi_amax;
    long max_it;
    const unsigned char *hold_at;  /* (max_it + 2,) sweep -> hold point? */
    int unshifted;
    int tempered;                /* inv_t != 1: the detAVI local step at temperature T = 1/inv_t */
    double inv_t;
    double *buf, *g, *th, *G, *Z, *R;  /* scratch: (K, Lmax), (K,) x 3, (Lmax,) x 2 */
    Py_ssize_t *live, *keep;           /* (K,) x 2 */
} Ctx;

/* Fit one document. Returns its sweeps, or -(sweeps) when a held topic fails
 * the final check (the caller then fits it again with hold = 0). The buffer
 * holds one row of L words per live topic (topic-major), so both products of
 * a sweep run along contiguous rows of length L. */
/* x86-64 Linux: an AVX2/FMA clone next to the baseline one, picked at load time. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES static long fit_doc(Ctx *c, const int64_t *idx, const double *cnt, Py_ssize_t L, int hold,
                    double *gamma_out, double *Z_out, double *shift_out)
{
    const Py_ssize_t K = c->K;
    double *buf = c->buf, *g = c->g, *th = c->th, *G = c->G, *Z = c->Z, *R = c->R;
    Py_ssize_t *live = c->live;
    Py_ssize_t nl = K, j, kk;
    double pend = 0.0, s = 0.0;
    int held_any = 0;
    long it;

    for (kk = 0; kk < K; kk++) {              /* contiguous writes; the L rows stay in L1 */
        const double *col = c->eb + kk;
        double *dst = buf + kk * L;
        for (j = 0; j < L; j++)
            dst[j] = col[idx[j] * K];
    }
    for (kk = 0; kk < K; kk++) {
        live[kk] = kk;
        g[kk] = 1.0;
        th[kk] = 1.0;
    }
    matvec_t(buf, th, nl, L, Z);
    for (it = 1;; it++) {
        for (j = 0; j < L; j++)
            R[j] = cnt[j] / Z[j];
        double change = pend, gmax = 0.0;
        pend = 0.0;
        for (kk = 0; kk < nl; kk++) {
            G[kk] = dot(buf + kk * L, R, L);
            /* tempered: gamma = alpha_T + (1/T) sum_w n_w phi_w, alpha_T = 1 + (alpha - 1)/T
             * (lda.py passes alpha_T as alpha); the untempered expression is kept as it was */
            const double gn = c->tempered ? c->alpha[live[kk]] + c->inv_t * (th[kk] * G[kk])
                                          : c->alpha[live[kk]] + th[kk] * G[kk];
            change += fabs(gn - g[kk]);
            g[kk] = gn;
            if (gn > gmax)
                gmax = gn;
        }
        s = c->unshifted ? 0.0 : digamma_pos(gmax);
        if (c->tempered)                       /* exp((psi(gamma_k) - s) / T) */
            for (kk = 0; kk < nl; kk++)
                th[kk] = exp(c->inv_t * (digamma_pos(g[kk]) - s));
        else
            for (kk = 0; kk < nl; kk++)
                th[kk] = psi_or_exp(g[kk], s, 1);
        matvec_t(buf, th, nl, L, Z);
        if (change < c->tolK || it >= c->max_it)
            break;
        if (hold && c->hold_at[it]) {
            double zmin = INFINITY;
            for (j = 0; j < L; j++)
                if (Z[j] < zmin)
                    zmin = Z[j];
            const double lim = c->eps * zmin;
            Py_ssize_t *keep = c->keep, nk = 0;
            for (kk = 0; kk < nl; kk++) {
                if (th[kk] <= lim)
                    pend += g[kk] - c->alpha[live[kk]];   /* gamma_k -> alpha_k */
                else
                    keep[nk++] = kk;
            }
            if (nk < nl) {
                held_any = 1;
                for (kk = 0; kk < nk; kk++) {
                    live[kk] = live[keep[kk]];
                    g[kk] = g[keep[kk]];
                    th[kk] = th[keep[kk]];
                    if (keep[kk] != kk)
                        memcpy(buf + kk * L, buf + keep[kk] * L, L * sizeof(double));
                }
                nl = nk;
            }
        }
    }
    for (kk = 0; kk < K; kk++)
        gamma_out[kk] = c->alpha[kk];
    for (kk = 0; kk < nl; kk++)
        gamma_out[live[kk]] = g[kk];
    memcpy(Z_out, Z, L * sizeof(double));
    *shift_out = s;
    if (held_any) {
        double zmin = INFINITY;
        for (j = 0; j < L; j++)
            if (cnt[j] > 0 && Z[j] < zmin)
                zmin = Z[j];
        if (exp(c->tempered ? c->inv_t * (c->psi_amax - s) : c->psi_amax - s) > c->eps * zmin)
            return -it;
    }
    return it;
}

#define NEED(cond, msg) do { if (!(cond)) { PyErr_SetString(PyExc_ValueError, msg); goto done; } } while (0)

static PyObject *fit_gamma(PyObject *self, PyObject *args)
{
    Py_buffer eb, indptr, indices, data, alpha, hold_at, gamma, n_iter, Zout, shift;
    Py_ssize_t K;
    double tolK, eps, psi_amax;
    long max_it;
    int unshifted;
    double inv_t = 1.0;
    PyObject *ret = NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*ddldy*pw*w*w*w*|d", &eb, &K, &indptr, &indices, &data,
                          &alpha, &tolK, &eps, &max_it, &psi_amax, &hold_at, &unshifted,
                          &gamma, &n_iter, &Zout, &shift, &inv_t))
        return NULL;
    const Py_ssize_t n = indptr.len / 8 - 1, nnz = data.len / 8;
    const Py_ssize_t rows = K > 0 ? eb.len / 8 / K : 0;
    const int64_t *ip = indptr.buf, *ix = indices.buf;
    NEED(K > 0 && eb.len == rows * K * 8, "eb must be (rows, K) float64");
    NEED(n >= 0 && indices.len == nnz * 8 && alpha.len == K * 8, "bad CSR or alpha buffers");
    NEED(hold_at.len >= max_it + 2 && max_it >= 1, "hold_at must have max_it + 2 entries");
    NEED(inv_t > 0.0 && inv_t <= 1.0, "inv_t = 1/T must be in (0, 1]");
    NEED(gamma.len == n * K * 8 && n_iter.len == n * 8 && Zout.len == nnz * 8 && shift.len == n * 8,
         "bad output buffers");
    NEED(n == 0 || (ip[0] == 0 && ip[n] == nnz), "indptr must run from 0 to nnz");
    Py_ssize_t Lmax = 0, i, j;
    for (i = 0; i < n; i++) {
        NEED(ip[i + 1] >= ip[i], "indptr must not decrease");
        if (ip[i + 1] - ip[i] > Lmax)
            Lmax = ip[i + 1] - ip[i];
    }
    for (j = 0; j < nnz; j++)
        NEED(ix[j] >= 0 && ix[j] < rows, "word index out of range");
    c.eb = eb.buf;
    c.K = K;
    c.alpha = alpha.buf;
    c.tolK = tolK;
    c.eps = eps;
    c.psi_amax = psi_amax;
    c.max_it = max_it;
    c.hold_at = hold_at.buf;
    c.unshifted = unshifted;
    c.tempered = inv_t != 1.0;
    c.inv_t = inv_t;
    c.buf = malloc(sizeof(double) * (size_t)(Lmax > 0 ? Lmax : 1) * (size_t)K);
    c.g = malloc(sizeof(double) * (size_t)K * 3);
    c.Z = malloc(sizeof(double) * (size_t)(Lmax > 0 ? Lmax : 1) * 2);
    c.live = malloc(sizeof(Py_ssize_t) * (size_t)K * 2);
    if (!c.buf || !c.g || !c.Z || !c.live) {
        PyErr_NoMemory();
        goto done;
    }
    c.th = c.g + K;
    c.keep = c.live + K;
    c.R = c.Z + (Lmax > 0 ? Lmax : 1);
    c.G = c.g + 2 * K;
    {
        const int hold = 1;                    /* hold_at says where (all zero: never) */
        double *gam = gamma.buf, *zo = Zout.buf, *sh = shift.buf;
        int64_t *ni = n_iter.buf;
        const double *cnt = data.buf;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            const Py_ssize_t a = ip[i], L = ip[i + 1] - ip[i];
            long r = fit_doc(&c, ix + a, cnt + a, L, hold, gam + i * K, zo + a, sh + i);
            if (r < 0)                         /* a held topic came back: no holding */
                r = fit_doc(&c, ix + a, cnt + a, L, 0, gam + i * K, zo + a, sh + i);
            ni[i] = r;
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(c.buf);
    free(c.g);
    free(c.Z);
    free(c.live);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&indptr);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&data);
    PyBuffer_Release(&alpha);
    PyBuffer_Release(&hold_at);
    PyBuffer_Release(&gamma);
    PyBuffer_Release(&n_iter);
    PyBuffer_Release(&Zout);
    PyBuffer_Release(&shift);
    return ret;
}

static PyMethodDef methods[] = {
    {"fit_gamma", fit_gamma, METH_VARARGS,
     "fit_gamma(eb, K, indptr, indices, data, alpha, tolK, eps, max_it, psi_amax, hold_at, "
     "unshifted, gamma, n_iter, Z, shift[, inv_t]): the LDA local step of every document (lda.py); "
     "inv_t = 1/T < 1 runs it at temperature T (detAVI), with eb = exp((E[log beta] - m)/T) and "
     "alpha = 1 + (alpha - 1)/T, psi_amax = psi(max of that alpha)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ldakernel",
                                    "Compiled LDA local step (see streamsvi.models.lda).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__ldakernel(void) { return PyModule_Create(&module); }
