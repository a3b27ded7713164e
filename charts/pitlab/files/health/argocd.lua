-- Argo CD health of a pitlab resource: PitTraining and LeakageEval (group pitlab.io), one script for both.
-- Argo CD sets the global `obj` (the resource) and reads the returned table's `status` and `message`.
-- Reads what the pitlab operator writes (docs/kubernetes.md, "GitOps health"): status.phase,
-- status.observedGeneration, status.progress and the kstatus conditions Ready, Reconciling and Stalled.
--   status missing, or of an older generation  -> Progressing (the operator has not seen this spec yet)
--   phase Interrupted (pitlab run, resumable)   -> Suspended
--   Stalled=True or phase Failed                -> Degraded (failed, or blocked until the cluster changes)
--   Ready=True                                   -> Healthy (Succeeded)
--   waiting for admission (Queued, Preempted)    -> Suspended
--   anything else                                -> Progressing (the phase, the step, percent done and ETA)
-- Written for Lua 5.1 (Argo CD's interpreter); tests/test_gitops_health.py runs it on the operator's statuses.

local WAITING = { Queued = true, Preempted = true, Suspended = true }

local function find_condition(status, wanted)
  if type(status.conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

-- "Reason: message" of a condition (for outcomes, where the reason says what happened).
local function describe(c, fallback)
  if c == nil or c.reason == nil then
    return fallback
  end
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

-- The message of a condition, else its reason (while running, the reason only repeats the phase).
local function detail(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil then
    return c.reason
  end
  return fallback
end

local function progress_note(p)
  if type(p) ~= "table" or p.step == nil or p.totalSteps == nil then
    return nil
  end
  local note = string.format("step %d/%d", p.step, p.totalSteps)
  if p.percent ~= nil then
    note = note .. " (" .. string.format("%.1f", p.percent) .. "%)"
  end
  if p.eta ~= nil and p.etaSeconds ~= 0 then
    note = note .. ", ETA " .. p.eta
  end
  return note
end

local function stale(obj, status)
  local generation = obj.metadata and obj.metadata.generation
  local observed = status.observedGeneration
  return generation ~= nil and observed ~= nil and observed < generation, generation, observed
end

local function health(obj)
  local status = obj.status
  if type(status) ~= "table" or status.phase == nil then
    return "Progressing", "waiting for the pitlab operator to take it up"
  end
  local old, generation, observed = stale(obj, status)
  if old then
    return "Progressing", string.format("waiting for the pitlab operator to observe generation %d (status is of "
      .. "generation %d)", generation, observed)
  end
  local phase = status.phase
  local stalled = find_condition(status, "Stalled")
  if phase == "Interrupted" then
    return "Suspended", describe(stalled, phase) .. " (resume with pitlab run --resume)"
  end
  if is_true(stalled) or phase == "Failed" then
    return "Degraded", describe(stalled, phase)
  end
  local ready = find_condition(status, "Ready")
  if is_true(ready) then
    return "Healthy", describe(ready, phase)
  end
  local reconciling = find_condition(status, "Reconciling")
  if WAITING[phase] or (reconciling ~= nil and WAITING[reconciling.reason]) then
    return "Suspended", phase .. ": " .. describe(reconciling, "waiting for admission")
  end
  local note = progress_note(status.progress)
  if note ~= nil and phase == "Training" then
    return "Progressing", phase .. ": " .. note
  end
  return "Progressing", phase .. ": " .. detail(reconciling, "in progress")
end

local hs = {}
hs.status, hs.message = health(obj)
return hs
