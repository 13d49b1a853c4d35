/*
 * fakegpu-daemon's jobs: the checkpoint calls of another process (lock, checkpoint, restore, unlock,
 * their queries) become jobs of the target's restore thread, which takes them over its service
 * connection (see fakegpu.h).
 */
#include "fakegpu_daemon.h"

/* ---- service connection (the restore thread of a client) ---- */

int handle_svc_hello(struct conn *c, struct fg_msg *m)
{
	pthread_mutex_lock(&g_lock);
	struct client *cl = find_client(m->a[0]);
	/* A FIFO shared by replicas: the job is for the thread of the process holding the client. */
	uint64_t sender = m->a[2];
	if (cl && (cl->origin || cl->cloned) && cl->holder && sender && sender != cl->holder) {
		pthread_mutex_unlock(&g_lock);
		return reply(c, FG_NOT_YOURS, 0, 0, 0, NULL, 0);
	}
	if (!cl || cl->job_seq != m->a[1] || cl->job_phase != JOB_PENDING) {
		pthread_mutex_unlock(&g_lock);
		dbg("stale doorbell of client %llu seq %llu ignored", (unsigned long long)m->a[0],
		    (unsigned long long)m->a[1]);
		return reply(c, FG_CANCELLED, 0, 0, 0, NULL, 0);
	}
	cl->job_phase = JOB_ACCEPTED;
	cl->job_conn = c;
	c->client = cl;
	c->is_svc = 1;
	uint32_t map[FG_MAX_GPUS];
	memcpy(map, cl->job_map, sizeof(map));
	int action = cl->job_action;
	uint32_t lock_timeout = cl->job_lock_timeout, crash = cl->job_crash;
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_lock);
	dbg("client %llu: service thread took %s (seq %llu)", (unsigned long long)cl->id,
	    action_name(action), (unsigned long long)m->a[1]);
	return reply(c, CUDA_SUCCESS, (uint64_t)action, lock_timeout, crash, map, sizeof(map));
}

int handle_svc_op(struct conn *c, struct fg_msg *m)
{
	struct client *cl = c->client;
	struct alloc *a;

	switch (m->op) {
	case FG_SVC_LIST: {
		pthread_mutex_lock(&cl->mem_lock);
		size_t n = 0;
		for (a = cl->allocs; a; a = a->next)
			n++;
		struct fg_buf *bufs = calloc(n ? n : 1, sizeof(*bufs));
		if (!bufs) {
			pthread_mutex_unlock(&cl->mem_lock);
			return reply(c, CUDA_ERROR_OUT_OF_MEMORY, 0, 0, 0, NULL, 0);
		}
		n = 0;
		for (a = cl->allocs; a; a = a->next, n++) {
			bufs[n].dptr = a->dptr;
			bufs[n].size = a->size;
			bufs[n].gpu = a->gpu;
		}
		pthread_mutex_unlock(&cl->mem_lock);
		int rc = reply(c, CUDA_SUCCESS, n, 0, 0, bufs, n * sizeof(*bufs));
		free(bufs);
		return rc;
	}
	case FG_SVC_PULL: {
		pthread_mutex_lock(&cl->mem_lock);
		for (a = cl->allocs; a && a->dptr != m->a[0]; a = a->next)
			;
		int rc = a ? reply(c, CUDA_SUCCESS, 0, 0, 0, a->data, a->size)
			   : reply(c, CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
		pthread_mutex_unlock(&cl->mem_lock);
		return rc;
	}
	case FG_SVC_PUSH: {
		pthread_mutex_lock(&cl->mem_lock);
		CUresult r = find_range(cl, m->a[0], 1) ? CUDA_ERROR_INVALID_VALUE
							 : alloc_mem(cl, (uint32_t)m->a[1], m->len, m->a[0], &a);
		int rc = r == CUDA_SUCCESS ? fg_read_full(c->fd, a->data, m->len) : drain(c->fd, m->len);
		pthread_mutex_unlock(&cl->mem_lock);
		if (rc)
			return -1;
		return reply(c, r, 0, 0, 0, NULL, 0);
	}
	case FG_SVC_DONE: {
		int32_t st = m->status;
		uint64_t per_gpu[FG_MAX_GPUS] = { 0 };
		pthread_mutex_lock(&g_lock);
		int action = cl->job_action;
		pthread_mutex_unlock(&g_lock);
		if (action == FG_ACT_CHECKPOINT && st == CUDA_SUCCESS) {
			pthread_mutex_lock(&cl->mem_lock);
			free_all(cl, per_gpu);
			pthread_mutex_unlock(&cl->mem_lock);
		} else if (action == FG_ACT_RESTORE && st != CUDA_SUCCESS) {
			pthread_mutex_lock(&cl->mem_lock);
			free_all(cl, NULL);
			pthread_mutex_unlock(&cl->mem_lock);
		}
		pthread_mutex_lock(&g_lock);
		switch (action) {
		case FG_ACT_LOCK:
			if (st == CUDA_SUCCESS)
				cl->state = CU_PROCESS_STATE_LOCKED;
			break;
		case FG_ACT_CHECKPOINT:
			if (st == CUDA_SUCCESS) {
				cl->state = CU_PROCESS_STATE_CHECKPOINTED;
				memcpy(cl->ckpt_bytes, per_gpu, sizeof(per_gpu));
			}
			break;
		case FG_ACT_RESTORE:
			if (st == CUDA_SUCCESS) {
				uint32_t mask = 0;
				for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
					if (cl->used_mask & (1u << g))
						mask |= 1u << cl->job_map[g];
				cl->used_mask = mask;
				cl->state = CU_PROCESS_STATE_LOCKED;
			}
			break;
		case FG_ACT_UNLOCK:
			if (st == CUDA_SUCCESS)
				cl->state = CU_PROCESS_STATE_RUNNING;
			break;
		}
		cl->job_result = st;
		cl->job_phase = JOB_FINISHING; /* done once the service connection is closed */
		pthread_mutex_unlock(&g_lock);
		dbg("client %llu: %s finished with %d", (unsigned long long)cl->id, action_name(action), st);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	}
	}
	logmsg("unexpected op %u on a service connection", m->op);
	return -1;
}

void svc_closed(struct conn *c)
{
	struct client *cl = c->client;
	int died = 0;
	pthread_mutex_lock(&g_lock);
	if (cl->job_conn == c) {
		cl->job_conn = NULL;
		if (cl->job_phase == JOB_FINISHING) {
			cl->job_phase = JOB_DONE;
		} else if (cl->job_phase == JOB_ACCEPTED) {
			/* the service thread vanished mid-job: the process died */
			cl->job_phase = JOB_DONE;
			cl->job_result = CUDA_ERROR_OPERATING_SYSTEM;
			died = !cl->main_conn;
		}
		pthread_cond_broadcast(&g_cond);
	}
	pthread_mutex_unlock(&g_lock);
	if (died)
		client_died(cl);
}

/* ---- checkpoint side ---- */

static int find_gpu_by_uuid(const unsigned char *uuid)
{
	for (uint32_t g = 0; g < g_devs.count; g++)
		if (!memcmp(g_devs.dev[g].uuid, uuid, 16))
			return (int)g;
	return -1;
}

static int peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

int handle_ck_action(struct conn *c, struct fg_msg *m)
{
	uint64_t id = m->a[0];
	int action = (int)m->a[1];
	uint64_t call_timeout = m->a[2];
	uint64_t lock_timeout = m->a[3];
	uint64_t start = fg_now_ms();
	struct fg_pair *pairs = NULL;
	size_t npairs = 0;
	char path[PATH_MAX];

	if (m->len) {
		if (m->len % sizeof(struct fg_pair) || m->len > 1024 * sizeof(struct fg_pair))
			return -1;
		pairs = malloc(m->len);
		if (!pairs || fg_read_full(c->fd, pairs, m->len)) {
			free(pairs);
			return -1;
		}
		npairs = m->len / sizeof(struct fg_pair);
	}

	pthread_mutex_lock(&g_lock);
	struct client *cl = client_of(id, m->a[5], m->status);
	CUresult r = CUDA_SUCCESS;
	uint32_t map[FG_MAX_GPUS];
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
		map[g] = g;
	static const CUprocessState need[] = {
		[FG_ACT_LOCK] = CU_PROCESS_STATE_RUNNING,
		[FG_ACT_CHECKPOINT] = CU_PROCESS_STATE_LOCKED,
		[FG_ACT_RESTORE] = CU_PROCESS_STATE_CHECKPOINTED,
		[FG_ACT_UNLOCK] = CU_PROCESS_STATE_LOCKED,
	};
	if (cl && action == FG_ACT_PING && cl->job_phase != JOB_NONE && cl->job_phase != JOB_DONE) {
		/* the restore thread is at work on another call: it is running, nothing to ask */
		pthread_mutex_unlock(&g_lock);
		free(pairs);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	}
	if (!cl)
		r = CUDA_ERROR_NOT_FOUND;
	else if (action < FG_ACT_LOCK || action > FG_ACT_PING)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (cl->job_phase != JOB_NONE && cl->job_phase != JOB_DONE)
		r = CUDA_ERROR_ILLEGAL_STATE; /* another call on this process is in progress */
	else if (action != FG_ACT_PING && cl->state != need[action])
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (r == CUDA_SUCCESS && action == FG_ACT_RESTORE && npairs) {
		/* every checkpointed GPU must be listed (with --pairs-of all: every GPU, onto distinct GPUs) */
		uint32_t targets = 0;
		for (uint32_t g = 0; g < g_devs.count && r == CUDA_SUCCESS; g++) {
			if (!g_pairs_of_all && !(cl->used_mask & (1u << g)))
				continue;
			size_t i;
			for (i = 0; i < npairs; i++)
				if (!memcmp(pairs[i].old_uuid, g_devs.dev[g].uuid, 16))
					break;
			if (i == npairs) {
				logmsg("restore of client %llu: GPU %u is not in the GPU pairs",
				       (unsigned long long)id, g);
				r = CUDA_ERROR_INVALID_VALUE;
				break;
			}
			int ng = find_gpu_by_uuid(pairs[i].new_uuid);
			if (ng < 0) {
				logmsg("restore of client %llu: new GPU UUID of pair %zu does not exist",
				       (unsigned long long)id, i);
				r = CUDA_ERROR_INVALID_DEVICE;
				break;
			}
			if (g_pairs_of_all && (targets & (1u << ng))) {
				logmsg("restore of client %llu: two GPUs paired onto GPU %d", (unsigned long long)id, ng);
				r = CUDA_ERROR_INVALID_VALUE;
				break;
			}
			targets |= 1u << ng;
			map[g] = (uint32_t)ng;
		}
	}
	if (r == CUDA_SUCCESS && action == FG_ACT_RESTORE) {
		uint64_t need_bytes[FG_MAX_GPUS] = { 0 };
		for (uint32_t g = 0; g < g_devs.count; g++)
			need_bytes[map[g]] += cl->ckpt_bytes[g];
		for (uint32_t g = 0; g < g_devs.count; g++)
			if (g_gpu_used[g] + need_bytes[g] > g_devs.dev[g].total_mem)
				r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	free(pairs);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&g_lock);
		dbg("%s of client %llu refused: %d", action_name(action), (unsigned long long)id, r);
		return reply(c, r, 0, 0, 0, NULL, 0);
	}

	uint64_t seq = g_next_seq++;
	cl->job_seq = seq;
	cl->job_phase = JOB_PENDING;
	cl->job_action = action;
	cl->job_result = CUDA_ERROR_UNKNOWN;
	cl->job_crash = (uint32_t)m->a[4];
	cl->job_lock_timeout = (uint32_t)lock_timeout;
	memcpy(cl->job_map, map, sizeof(map));

	/* ring the doorbell */
	doorbell_path(path, sizeof(path), cl);
	int ffd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	struct fg_doorbell db = { .id = cl->id, .seq = seq };
	if (ffd < 0 || write(ffd, &db, sizeof(db)) != (ssize_t)sizeof(db)) {
		logmsg("cannot ring the doorbell %s: %s", path, strerror(errno));
		if (ffd >= 0)
			close(ffd);
		cl->job_phase = JOB_NONE;
		pthread_mutex_unlock(&g_lock);
		return reply(c, CUDA_ERROR_OPERATING_SYSTEM, 0, 0, 0, NULL, 0);
	}
	close(ffd);
	dbg("%s of client %llu requested (seq %llu)", action_name(action), (unsigned long long)id,
	    (unsigned long long)seq);

	/* wait for the service thread to take the job */
	uint64_t deadline = start + call_timeout;
	if (action == FG_ACT_LOCK && lock_timeout && start + lock_timeout < deadline)
		deadline = start + lock_timeout;
	while (cl->job_seq == seq && cl->job_phase == JOB_PENDING) {
		uint64_t t = fg_now_ms();
		if (t >= deadline || peer_hung_up(c->fd)) {
			cl->job_phase = JOB_NONE;
			int pid = cl->pid;
			pthread_mutex_unlock(&g_lock);
			logmsg("%s of client %llu (pid %d): the service thread did not answer within %llu ms",
			       action_name(action), (unsigned long long)id, pid, (unsigned long long)(t - start));
			return reply(c, CUDA_ERROR_TIMEOUT, 0, 0, 0, NULL, 0);
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t step = deadline - t < 100 ? deadline - t : 100;
		ts.tv_nsec += (long)(step * 1000000);
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&g_cond, &g_lock, &ts);
	}
	/* taken: wait until it is finished. If the service thread stalls mid-job
	 * (stopped again, or blocked), report a timeout; the job stays in
	 * progress, so further calls get CUDA_ERROR_ILLEGAL_STATE until it ends. */
	deadline = fg_now_ms() + call_timeout;
	while (cl->job_seq == seq && cl->job_phase != JOB_DONE) {
		if (fg_now_ms() >= deadline) {
			int pid = cl->pid;
			pthread_mutex_unlock(&g_lock);
			logmsg("%s of client %llu (pid %d): the service thread took the job but did not finish it "
			       "within %llu ms",
			       action_name(action), (unsigned long long)id, pid, (unsigned long long)call_timeout);
			return reply(c, CUDA_ERROR_TIMEOUT, 0, 0, 0, NULL, 0);
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 100 * 1000000;
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&g_cond, &g_lock, &ts);
	}
	r = cl->job_seq == seq ? (CUresult)cl->job_result : CUDA_ERROR_UNKNOWN;
	pthread_mutex_unlock(&g_lock);
	return reply(c, r, 0, 0, 0, NULL, 0);
}

int handle_ck_query(struct conn *c, struct fg_msg *m)
{
	pthread_mutex_lock(&g_lock);
	struct client *cl = client_of(m->a[0], m->a[1], m->status);
	CUresult r = cl ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	uint64_t st = cl ? (uint64_t)cl->state : 0, tid = cl ? (uint64_t)cl->tid : 0,
		 pid = cl ? (uint64_t)cl->pid : 0;
	pthread_mutex_unlock(&g_lock);
	return reply(c, r, st, tid, pid, NULL, 0);
}
