/* kvg_vk_loader.h: kvgen's own Vulkan loader (private). libkvgen has no link-time dependency
 * on libvulkan: it is built with VK_NO_PROTOTYPES, and every Vulkan entry point it calls is a
 * function pointer that vk_loader.c fills at run time. The pointers are named kvg_vkXxx so they
 * never collide with the vkXxx symbols of a host that links libvulkan itself; the macros below
 * give them their Vulkan names, so the backend's call sites read like plain Vulkan.
 *
 * Loading happens in two steps, both once per process and thread-safe:
 *  - kvg_vk_load: finds vkGetInstanceProcAddr (the host's, or dlopen of libvulkan.so.1 /
 *    LoadLibrary of vulkan-1.dll) and resolves the global entry points;
 *  - kvg_vk_load_instance: resolves the instance and device entry points through the first
 *    instance kvgen sees. They are the loader's dispatching entry points, valid for every
 *    instance and device of that loader.
 * KVGEN_VULKAN_LOADER overrides the library: a path, or "none" to behave as on a machine
 * without Vulkan (read at the first load only). */
#ifndef KVG_VK_LOADER_H
#define KVG_VK_LOADER_H
#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>
#include "kvgen.h"

/* entry points resolved with vkGetInstanceProcAddr(NULL, ...) */
#define KVG_VK_GLOBAL_FUNCS(X)                                                                      \
    X(vkCreateInstance)                                                                             \
    X(vkEnumerateInstanceExtensionProperties)                                                       \
    X(vkEnumerateInstanceLayerProperties)

/* entry points resolved with vkGetInstanceProcAddr(instance, ...) */
#define KVG_VK_INSTANCE_FUNCS(X)                                                                    \
    X(vkDestroyInstance)                                                                            \
    X(vkEnumeratePhysicalDevices)                                                                   \
    X(vkGetPhysicalDeviceProperties)                                                                \
    X(vkGetPhysicalDeviceProperties2)                                                               \
    X(vkGetPhysicalDeviceFeatures2)                                                                 \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                     \
    X(vkGetPhysicalDeviceMemoryProperties)                                                          \
    X(vkEnumerateDeviceExtensionProperties)                                                         \
    X(vkCreateDevice)                                                                               \
    X(vkDestroyDevice)                                                                              \
    X(vkGetDeviceQueue)                                                                             \
    X(vkDeviceWaitIdle)                                                                             \
    X(vkQueueSubmit)                                                                                \
    X(vkQueueWaitIdle)                                                                              \
    X(vkCreateBuffer)                                                                               \
    X(vkDestroyBuffer)                                                                              \
    X(vkGetBufferMemoryRequirements)                                                                \
    X(vkAllocateMemory)                                                                             \
    X(vkFreeMemory)                                                                                 \
    X(vkBindBufferMemory)                                                                           \
    X(vkMapMemory)                                                                                  \
    X(vkCreateFence)                                                                                \
    X(vkDestroyFence)                                                                               \
    X(vkResetFences)                                                                                \
    X(vkWaitForFences)                                                                              \
    X(vkCreateShaderModule)                                                                         \
    X(vkDestroyShaderModule)                                                                        \
    X(vkCreatePipelineCache)                                                                        \
    X(vkDestroyPipelineCache)                                                                       \
    X(vkGetPipelineCacheData)                                                                       \
    X(vkCreateComputePipelines)                                                                     \
    X(vkDestroyPipeline)                                                                            \
    X(vkCreatePipelineLayout)                                                                       \
    X(vkDestroyPipelineLayout)                                                                      \
    X(vkCreateDescriptorSetLayout)                                                                  \
    X(vkDestroyDescriptorSetLayout)                                                                 \
    X(vkCreateDescriptorPool)                                                                       \
    X(vkDestroyDescriptorPool)                                                                      \
    X(vkResetDescriptorPool)                                                                        \
    X(vkAllocateDescriptorSets)                                                                     \
    X(vkUpdateDescriptorSets)                                                                       \
    X(vkCreateCommandPool)                                                                          \
    X(vkDestroyCommandPool)                                                                         \
    X(vkAllocateCommandBuffers)                                                                     \
    X(vkFreeCommandBuffers)                                                                         \
    X(vkBeginCommandBuffer)                                                                         \
    X(vkEndCommandBuffer)                                                                           \
    X(vkResetCommandBuffer)                                                                         \
    X(vkCreateQueryPool)                                                                            \
    X(vkDestroyQueryPool)                                                                           \
    X(vkGetQueryPoolResults)                                                                        \
    X(vkCmdBindPipeline)                                                                            \
    X(vkCmdBindDescriptorSets)                                                                      \
    X(vkCmdPushConstants)                                                                           \
    X(vkCmdDispatch)                                                                                \
    X(vkCmdDispatchBase)                                                                            \
    X(vkCmdPipelineBarrier)                                                                         \
    X(vkCmdCopyBuffer)                                                                              \
    X(vkCmdFillBuffer)                                                                              \
    X(vkCmdResetQueryPool)                                                                          \
    X(vkCmdWriteTimestamp)

#define KVG_VK_DECLARE(name) extern PFN_##name kvg_##name;
extern PFN_vkGetInstanceProcAddr kvg_vkGetInstanceProcAddr;
KVG_VK_GLOBAL_FUNCS(KVG_VK_DECLARE)
KVG_VK_INSTANCE_FUNCS(KVG_VK_DECLARE)
#undef KVG_VK_DECLARE

/* Finds the Vulkan loader and resolves the global entry points. host_gipa: the host's
 * vkGetInstanceProcAddr (kvgen_model_desc.vk_get_instance_proc_addr), or NULL to open the
 * library. Fails with KVGEN_E_DEVICE and a message naming what is missing (the library and the
 * system's reason, KVGEN_VULKAN_LOADER=none, a missing entry point); a host_gipa other than the
 * one already in use is KVGEN_E_INVALID_ARGUMENT. Once it succeeded it succeeds at once. */
kvgen_status kvg_vk_load(PFN_vkGetInstanceProcAddr host_gipa, kvgen_error *err);
/* Resolves the instance and device entry points through `instance` (the first call that
 * succeeds does it; later ones return at once). Needs kvg_vk_load first. */
kvgen_status kvg_vk_load_instance(VkInstance instance, kvgen_error *err);

/* the platform part (vk_loader.c): open a shared library, find a symbol in it */
void *kvg_vk_lib_open(const char *name, char *why, size_t why_size);
PFN_vkGetInstanceProcAddr kvg_vk_lib_gipa(void *lib);

#define vkGetInstanceProcAddr kvg_vkGetInstanceProcAddr
#define vkCreateInstance kvg_vkCreateInstance
#define vkEnumerateInstanceExtensionProperties kvg_vkEnumerateInstanceExtensionProperties
#define vkEnumerateInstanceLayerProperties kvg_vkEnumerateInstanceLayerProperties
#define vkDestroyInstance kvg_vkDestroyInstance
#define vkEnumeratePhysicalDevices kvg_vkEnumeratePhysicalDevices
#define vkGetPhysicalDeviceProperties kvg_vkGetPhysicalDeviceProperties
#define vkGetPhysicalDeviceProperties2 kvg_vkGetPhysicalDeviceProperties2
#define vkGetPhysicalDeviceFeatures2 kvg_vkGetPhysicalDeviceFeatures2
#define vkGetPhysicalDeviceQueueFamilyProperties kvg_vkGetPhysicalDeviceQueueFamilyProperties
#define vkGetPhysicalDeviceMemoryProperties kvg_vkGetPhysicalDeviceMemoryProperties
#define vkEnumerateDeviceExtensionProperties kvg_vkEnumerateDeviceExtensionProperties
#define vkCreateDevice kvg_vkCreateDevice
#define vkDestroyDevice kvg_vkDestroyDevice
#define vkGetDeviceQueue kvg_vkGetDeviceQueue
#define vkDeviceWaitIdle kvg_vkDeviceWaitIdle
#define vkQueueSubmit kvg_vkQueueSubmit
#define vkQueueWaitIdle kvg_vkQueueWaitIdle
#define vkCreateBuffer kvg_vkCreateBuffer
#define vkDestroyBuffer kvg_vkDestroyBuffer
#define vkGetBufferMemoryRequirements kvg_vkGetBufferMemoryRequirements
#define vkAllocateMemory kvg_vkAllocateMemory
#define vkFreeMemory kvg_vkFreeMemory
#define vkBindBufferMemory kvg_vkBindBufferMemory
#define vkMapMemory kvg_vkMapMemory
#define vkCreateFence kvg_vkCreateFence
#define vkDestroyFence kvg_vkDestroyFence
#define vkResetFences kvg_vkResetFences
#define vkWaitForFences kvg_vkWaitForFences
#define vkCreateShaderModule kvg_vkCreateShaderModule
#define vkDestroyShaderModule kvg_vkDestroyShaderModule
#define vkCreatePipelineCache kvg_vkCreatePipelineCache
#define vkDestroyPipelineCache kvg_vkDestroyPipelineCache
#define vkGetPipelineCacheData kvg_vkGetPipelineCacheData
#define vkCreateComputePipelines kvg_vkCreateComputePipelines
#define vkDestroyPipeline kvg_vkDestroyPipeline
#define vkCreatePipelineLayout kvg_vkCreatePipelineLayout
#define vkDestroyPipelineLayout kvg_vkDestroyPipelineLayout
#define vkCreateDescriptorSetLayout kvg_vkCreateDescriptorSetLayout
#define vkDestroyDescriptorSetLayout kvg_vkDestroyDescriptorSetLayout
#define vkCreateDescriptorPool kvg_vkCreateDescriptorPool
#define vkDestroyDescriptorPool kvg_vkDestroyDescriptorPool
#define vkResetDescriptorPool kvg_vkResetDescriptorPool
#define vkAllocateDescriptorSets kvg_vkAllocateDescriptorSets
#define vkUpdateDescriptorSets kvg_vkUpdateDescriptorSets
#define vkCreateCommandPool kvg_vkCreateCommandPool
#define vkDestroyCommandPool kvg_vkDestroyCommandPool
#define vkAllocateCommandBuffers kvg_vkAllocateCommandBuffers
#define vkFreeCommandBuffers kvg_vkFreeCommandBuffers
#define vkBeginCommandBuffer kvg_vkBeginCommandBuffer
#define vkEndCommandBuffer kvg_vkEndCommandBuffer
#define vkResetCommandBuffer kvg_vkResetCommandBuffer
#define vkCreateQueryPool kvg_vkCreateQueryPool
#define vkDestroyQueryPool kvg_vkDestroyQueryPool
#define vkGetQueryPoolResults kvg_vkGetQueryPoolResults
#define vkCmdBindPipeline kvg_vkCmdBindPipeline
#define vkCmdBindDescriptorSets kvg_vkCmdBindDescriptorSets
#define vkCmdPushConstants kvg_vkCmdPushConstants
#define vkCmdDispatch kvg_vkCmdDispatch
#define vkCmdDispatchBase kvg_vkCmdDispatchBase
#define vkCmdPipelineBarrier kvg_vkCmdPipelineBarrier
#define vkCmdCopyBuffer kvg_vkCmdCopyBuffer
#define vkCmdFillBuffer kvg_vkCmdFillBuffer
#define vkCmdResetQueryPool kvg_vkCmdResetQueryPool
#define vkCmdWriteTimestamp kvg_vkCmdWriteTimestamp

#endif
